/* The scanner's per-line and per-file bulk work in compiled code: a block's candidate lines walked, each one's
 * bounds, line number and shape key found, and the lines whose reading is decided by their shape alone passed over
 * without a Python call (told NCCL channel lines, inert shapes that no digit-sensitive signature can match); the
 * prefilter's candidate lines from its automata's matches; a block's last lines and the marks of a file's last
 * lines' shapes. Every function has a pure-Python twin, the reference (read/bulk.py says which;
 * tests/unit/test_bulk_scan.py holds them equal). No Python object is touched while the GIL is released (long
 * newline counts).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem, memrchr */
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The last byte c of p[0:len], or NULL: memrchr where the C library has it (glibc, musl), else a loop. */
static const unsigned char *last_byte(const unsigned char *p, unsigned char c, Py_ssize_t len)
{
#if defined(__linux__)
    return len > 0 ? memrchr(p, c, (size_t)len) : NULL;
#else
    while (len-- > 0)
        if (p[len] == c)
            return p + len;
    return NULL;
#endif
}

/* spans at least this long have their newlines counted with the GIL released */
#define NOGIL_BYTES (64 << 10)

static Py_ssize_t count_nl(const unsigned char *p, Py_ssize_t len)
{
    Py_ssize_t count = 0;
    while (len >= 255 * 16) { /* byte counters that cannot overflow: the compiler vectorizes the inner loop */
        unsigned char acc[16] = {0};
        for (int round = 0; round < 255; round++, p += 16)
            for (int j = 0; j < 16; j++)
                acc[j] += p[j] == '\n';
        for (int j = 0; j < 16; j++)
            count += acc[j];
        len -= 255 * 16;
    }
    for (Py_ssize_t i = 0; i < len; i++)
        count += p[i] == '\n';
    return count;
}

static Py_ssize_t count_span(const unsigned char *p, Py_ssize_t len)
{
    Py_ssize_t count;
    if (len < NOGIL_BYTES)
        return count_nl(p, len);
    Py_BEGIN_ALLOW_THREADS
    count = count_nl(p, len);
    Py_END_ALLOW_THREADS
    return count;
}

static int clamp(Py_ssize_t *start, Py_ssize_t *end, Py_ssize_t size)
{
    if (*start < 0 || *end > size || *start > *end) {
        PyErr_SetString(PyExc_ValueError, "span out of the buffer");
        return -1;
    }
    return 0;
}

/* newlines(buffer, start, end) -> how many b'\n' buffer[start:end] holds */
static PyObject *bulk_newlines(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t start, end, count;
    if (!PyArg_ParseTuple(args, "y*nn:newlines", &buf, &start, &end))
        return NULL;
    if (clamp(&start, &end, buf.len) < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    count = count_span((const unsigned char *)buf.buf + start, end - start);
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(count);
}

/* 1 for a control byte as read/files.py's _CONTROL_BYTES holds them (below 32 but backspace, tab, line end, form
 * feed, carriage return and escape; and DEL), else 0: the bytes below 32 less the allowed ranges, as sums of
 * comparisons, so that the loop below vectorizes (an OR of comparisons becomes a 64-bit bit test that does not). */
static inline unsigned char control_byte(unsigned char c)
{
    return (unsigned char)((c < 32) - ((unsigned char)(c - 8) < 3) - ((unsigned char)(c - 12) < 2) - (c == 27)
                           + (c == 127));
}

static Py_ssize_t count_control(const unsigned char *p, Py_ssize_t len)
{
    Py_ssize_t count = 0;
    while (len >= 255 * 16) { /* byte counters that cannot overflow, as count_nl's */
        unsigned char acc[16] = {0};
        for (int round = 0; round < 255; round++, p += 16)
            for (int j = 0; j < 16; j++)
                acc[j] += control_byte(p[j]);
        for (int j = 0; j < 16; j++)
            count += acc[j];
        len -= 255 * 16;
    }
    for (Py_ssize_t i = 0; i < len; i++)
        count += control_byte(p[i]);
    return count;
}

/* control_bytes(buffer) -> how many of buffer's bytes are control bytes (files.py's _CONTROL_BYTES) */
static PyObject *bulk_control_bytes(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*:control_bytes", &buf))
        return NULL;
    Py_ssize_t count = count_control(buf.buf, buf.len);
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(count);
}

/* What may come before the `0x` of a hex run (digit_shape.BOUNDARY), and an ASCII word byte. */
static int run_boundary(unsigned char c) { return c == ' ' || c == '\t' || c == '=' || c == '(' || c == '{' || c == ','; }
static int word_byte(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/* The shape of raw[0:len]: digits 1-9 written as 0 but one right before an x or X, each hex run's digits (the
 * lowercase hex digits after a `0x` at the start or after a boundary, up to a byte that is no ASCII word byte)
 * written as 0, then the first two bytes of each "0000-00-00" found in that (left to right, without overlaps)
 * restored as written (line_recipes.masked_shape, the reference). */
static PyObject *shape_of(const unsigned char *raw, Py_ssize_t len)
{
    static const char date[] = "0000-00-00";
    PyObject *out = PyBytes_FromStringAndSize(NULL, len);
    if (out == NULL)
        return NULL;
    unsigned char *m = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < len; i++) {
        unsigned char c = raw[i];
        m[i] = (c >= '1' && c <= '9') ? '0' : c;
    }
    for (Py_ssize_t i = 0; i + 1 < len; i++) {
        if (raw[i] < '0' || raw[i] > '9' || (raw[i + 1] != 'x' && raw[i + 1] != 'X'))
            continue;
        m[i] = raw[i];
        if (raw[i] != '0' || (i > 0 && !run_boundary(raw[i - 1])))
            continue;
        Py_ssize_t end = i + 2;
        while (end < len && ((raw[end] >= '0' && raw[end] <= '9') || (raw[end] >= 'a' && raw[end] <= 'f')))
            end++;
        if (end > i + 2 && (end == len || !word_byte(raw[end]))) {
            memset(m + i + 2, '0', (size_t)(end - i - 2));
            i = end - 1;
        }
    }
    /* restoring bytes at..at+1 leaves the masked bytes from at+10 on, where the next search starts, as they were */
    for (Py_ssize_t at = 0; at + 10 <= len;) {
        const unsigned char *hit = memmem(m + at, (size_t)(len - at), date, 10);
        if (hit == NULL)
            break;
        at = hit - m;
        m[at] = raw[at];
        m[at + 1] = raw[at + 1];
        at += 10;
    }
    return out;
}

/* shape(raw) -> bytes: line_key's masked form of a raw line */
static PyObject *bulk_shape(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*:shape", &buf))
        return NULL;
    PyObject *out = shape_of((const unsigned char *)buf.buf, buf.len);
    PyBuffer_Release(&buf);
    return out;
}

static Py_ssize_t digits(const unsigned char *p, Py_ssize_t i, Py_ssize_t end)
{
    while (i < end && p[i] >= '0' && p[i] <= '9')
        i++;
    return i;
}

static Py_ssize_t hexes(const unsigned char *p, Py_ssize_t i, Py_ssize_t end)
{
    while (i < end && ((p[i] >= '0' && p[i] <= '9') || ((p[i] | 0x20) >= 'a' && (p[i] | 0x20) <= 'f')))
        i++;
    return i;
}

static int literal(const unsigned char *p, Py_ssize_t *i, Py_ssize_t end, const char *text)
{
    size_t n = strlen(text);
    if (end - *i < (Py_ssize_t)n || memcmp(p + *i, text, n) != 0)
        return 0;
    *i += (Py_ssize_t)n;
    return 1;
}

/* The rest of channel_lines._CHANNEL_LINE matched at p[i:end] (after its words " NCCL INFO Channel "): 1 and the
 * span of the printing process's NCCL rank (the sender's on [send], the receiver's on [receive]), else 0. Every
 * repeat in the pattern is followed by a byte it cannot take, so matching greedily is the regex's one way. */
/* One peer of a channel line at p[*i:end], `N[hex]`: 1, its rank's span and *i past it, else 0. */
static int peer(const unsigned char *p, Py_ssize_t *i, Py_ssize_t end, Py_ssize_t *rank, Py_ssize_t *rank_end)
{
    Py_ssize_t j = *i, k;
    if ((k = digits(p, j, end)) == j)
        return 0;
    *rank = j, *rank_end = k;
    if (!literal(p, &k, end, "[") || (j = hexes(p, k, end)) == k)
        return 0;
    *i = j;
    return 1;
}

static int channel_rest(const unsigned char *p, Py_ssize_t i, Py_ssize_t end, Py_ssize_t *rank, Py_ssize_t *rank_end)
{
    Py_ssize_t j, a, a_end, b, b_end;
    if ((j = digits(p, i, end)) == i)
        return 0;
    i = j;
    if (i < end && p[i] == '/') {
        if ((j = digits(p, i + 1, end)) == i + 1)
            return 0;
        i = j;
    }
    if (!literal(p, &i, end, " : ") || !peer(p, &i, end, &a, &a_end) || !literal(p, &i, end, "] -> ")
        || !peer(p, &i, end, &b, &b_end) || !literal(p, &i, end, "] ["))
        return 0;
    if (literal(p, &i, end, "send] via")) {
        *rank = a, *rank_end = a_end;
        return 1;
    }
    if (literal(p, &i, end, "receive] via")) {
        *rank = b, *rank_end = b_end;
        return 1;
    }
    return 0;
}

static const char CHANNEL_WORDS[] = " NCCL INFO Channel ";
#define CHANNEL_WORDS_LEN 19

/* The first CHANNEL_WORDS in p[at:end], or NULL: memchr for its 'N' (its second byte: NCCL's own words are most
 * lines' first), the rest compared there (glibc's memmem sets up a two-way search for each short line). */
static const unsigned char *channel_words(const unsigned char *p, Py_ssize_t at, Py_ssize_t end)
{
    while (end - at >= CHANNEL_WORDS_LEN) {
        const unsigned char *n = memchr(p + at + 1, 'N', (size_t)(end - at - 1));
        if (n == NULL)
            return NULL;
        Py_ssize_t words = n - p - 1; /* where they would start: at or after `at` */
        if (end - words < CHANNEL_WORDS_LEN)
            return NULL;
        if (memcmp(p + words, CHANNEL_WORDS, CHANNEL_WORDS_LEN) == 0)
            return p + words;
        at = words + 1;
    }
    return NULL;
}

/* Where the channel line in p[start:end] (`_CHANNEL_LINE.search`) has its words (*at: its head is p[start:*at])
 * and the printing process's NCCL rank (*rank, *rank_end): 1, or 0 when the line is no channel line. */
static int channel_spans(const unsigned char *p, Py_ssize_t start, Py_ssize_t end, Py_ssize_t *at, Py_ssize_t *rank,
                         Py_ssize_t *rank_end)
{
    Py_ssize_t from = start;
    const unsigned char *hit;
    while ((hit = channel_words(p, from, end)) != NULL) {
        *at = hit - p;
        if (channel_rest(p, *at + CHANNEL_WORDS_LEN, end, rank, rank_end))
            return 1;
        from = *at + 1;
    }
    return 0;
}

/* The (head, rank) key of those spans: a new tuple, NULL on error. */
static PyObject *channel_key_at(const unsigned char *p, Py_ssize_t start, Py_ssize_t at, Py_ssize_t rank,
                                Py_ssize_t rank_end)
{
    PyObject *head = PyBytes_FromStringAndSize((const char *)p + start, at - start);
    PyObject *who = head == NULL ? NULL : PyBytes_FromStringAndSize((const char *)p + rank, rank_end - rank);
    PyObject *key = who == NULL ? NULL : PyTuple_Pack(2, head, who);
    Py_XDECREF(head);
    Py_XDECREF(who);
    return key;
}

/* The key of the channel line in p[start:end] (`channel_lines.channel_key` of `_CHANNEL_LINE.search`): a new
 * (head, rank) tuple, Py_None when the line is no channel line, NULL on error. */
static PyObject *channel_key_of(const unsigned char *p, Py_ssize_t start, Py_ssize_t end)
{
    Py_ssize_t at, rank, rank_end;
    if (!channel_spans(p, start, end, &at, &rank, &rank_end))
        Py_RETURN_NONE;
    return channel_key_at(p, start, at, rank, rank_end);
}

/* channel_key(buffer, start, end) -> (head, rank) | None */
static PyObject *bulk_channel_key(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "y*nn:channel_key", &buf, &start, &end))
        return NULL;
    if (clamp(&start, &end, buf.len) < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    PyObject *out = channel_key_of((const unsigned char *)buf.buf, start, end);
    PyBuffer_Release(&buf);
    return out;
}

static Py_ssize_t line_end(const unsigned char *p, Py_ssize_t start, Py_ssize_t n)
{
    const unsigned char *nl = memchr(p + start, '\n', (size_t)(n - start));
    return nl == NULL ? n : nl - p;
}

/* Whether bytes p[0:len] are those of bytes object `b`. */
static int same_bytes(const unsigned char *p, Py_ssize_t len, PyObject *b)
{
    return PyBytes_GET_SIZE(b) == len && memcmp(PyBytes_AS_STRING(b), p, (size_t)len) == 0;
}

/* 1 when the line p[start:end] is a channel line whose key `channels` holds (file_scan's told_channel_line),
 * 0 when not, -1 on error. `told` (a list of one item, or None) holds the key last found in `channels`: a set
 * that only grows while a file is read, so a line with that key's bytes is told without a key built and hashed
 * (a file's channel lines come in runs of one head and rank); a key found there is kept in it. */
static int told_channel(const unsigned char *p, Py_ssize_t start, Py_ssize_t end, Py_ssize_t max_line,
                        PyObject *channels, PyObject *told)
{
    Py_ssize_t at, rank, rank_end;
    if (end - start > max_line || !channel_spans(p, start, end, &at, &rank, &rank_end))
        return 0;
    PyObject *last = told == NULL ? NULL : PyList_GET_ITEM(told, 0);
    if (last != NULL && PyTuple_Check(last) && PyTuple_GET_SIZE(last) == 2 && PyBytes_Check(PyTuple_GET_ITEM(last, 0))
        && PyBytes_Check(PyTuple_GET_ITEM(last, 1)) && same_bytes(p + start, at - start, PyTuple_GET_ITEM(last, 0))
        && same_bytes(p + rank, rank_end - rank, PyTuple_GET_ITEM(last, 1)))
        return 1;
    PyObject *key = channel_key_at(p, start, at, rank, rank_end);
    if (key == NULL)
        return -1;
    int found = PySet_Contains(channels, key);
    if (found == 1 && told != NULL) {
        PyList_SetItem(told, 0, key); /* steals the reference */
        return 1;
    }
    Py_DECREF(key);
    return found;
}

/* 1 when a line of shape `key` is remembered as inert with no digit-sensitive signature to ask (an entry
 * `(offset, ())` of the inert memo), 0 when not, -1 on error */
static int plainly_inert(PyObject *inert, PyObject *key)
{
    PyObject *known = PyDict_GetItemWithError(inert, key); /* borrowed */
    if (known == NULL)
        return PyErr_Occurred() ? -1 : 0;
    return PyTuple_Check(known) && PyTuple_GET_SIZE(known) == 2 && PyTuple_Check(PyTuple_GET_ITEM(known, 1))
        && PyTuple_GET_SIZE(PyTuple_GET_ITEM(known, 1)) == 0;
}

/* An argument of next_line as a Py_ssize_t into *out: 0, else -1 with the error set. */
static int size_arg(PyObject *arg, Py_ssize_t *out)
{
    *out = PyLong_AsSsize_t(arg);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* A new (idx, start, end, lineno, raw, key) tuple; `raw` stolen, `key` borrowed; NULL on error. */
static PyObject *line_found(Py_ssize_t idx, Py_ssize_t start, Py_ssize_t end, Py_ssize_t lineno, PyObject *raw,
                            PyObject *key)
{
    PyObject *out = PyTuple_New(6);
    if (out == NULL) {
        Py_DECREF(raw);
        return NULL;
    }
    Py_ssize_t values[4] = {idx, start, end, lineno};
    for (int i = 0; i < 4; i++) {
        PyObject *v = PyLong_FromSsize_t(values[i]);
        if (v == NULL) {
            Py_DECREF(raw);
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, v);
    }
    PyTuple_SET_ITEM(out, 4, raw);
    Py_INCREF(key);
    PyTuple_SET_ITEM(out, 5, key);
    return out;
}

/* next_line(block, n, cur, starts, idx, lineno, channels, inert, keyed_chars, max_line, told)
 *     -> (idx, start, end, lineno, raw, key)
 *
 * From `cur` in block[:n] (whole lines), the next candidate line (`starts`: sorted line offsets, from `idx` on)
 * that is to be read in Python: candidates before `cur` passed, told channel lines passed while `channels` is not
 * empty, and lines of at most `keyed_chars` bytes whose shape `inert` remembers with nothing to ask passed too.
 * Returns its index in `starts`, its bounds, the line count up to and with it, its bytes (at most `max_line`) and
 * its shape (None when longer than `keyed_chars`); past the last one `start` is -1 and `lineno` counts to `n`.
 * `told`: a list of one item where the channel key last found in `channels` is kept from call to call, the same
 * one for a file's blocks (None: none kept). Called once a candidate line read in Python: its arguments are taken
 * as they come (METH_FASTCALL), not through a format string. */
static PyObject *bulk_next_line(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer buf;
    Py_ssize_t n, cur, idx, lineno, keyed, max_line;
    PyObject *key = NULL;
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "next_line takes 11 arguments");
        return NULL;
    }
    PyObject *starts = args[3], *channels = args[6], *inert = args[7], *told = args[10];
    if (!PyList_Check(starts) || !PySet_Check(channels) || !PyDict_Check(inert)
        || (told != Py_None && (!PyList_Check(told) || PyList_GET_SIZE(told) != 1))) {
        PyErr_SetString(PyExc_TypeError, "next_line: starts a list, channels a set, inert a dict, told a list of one");
        return NULL;
    }
    if (size_arg(args[1], &n) < 0 || size_arg(args[2], &cur) < 0 || size_arg(args[4], &idx) < 0
        || size_arg(args[5], &lineno) < 0 || size_arg(args[8], &keyed) < 0 || size_arg(args[9], &max_line) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    if (told == Py_None)
        told = NULL;
    const unsigned char *p = buf.buf;
    Py_ssize_t zero = 0;
    if (clamp(&zero, &n, buf.len) < 0 || cur < 0 || idx < 0 || max_line < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "a negative position, index or line length");
        goto fail;
    }
    Py_ssize_t count = PyList_GET_SIZE(starts);
    for (;;) {
        Py_ssize_t at = -1;
        while (idx < count) {
            at = PyLong_AsSsize_t(PyList_GET_ITEM(starts, idx));
            if (at == -1 && PyErr_Occurred())
                goto fail;
            if (at < 0 || at > n) {
                PyErr_SetString(PyExc_ValueError, "a candidate start out of the block");
                goto fail;
            }
            if (at >= cur) {
                if (PySet_GET_SIZE(channels) == 0 || at >= n)
                    break;
                int is_told = told_channel(p, at, line_end(p, at, n), max_line, channels, told);
                if (is_told < 0)
                    goto fail;
                if (!is_told)
                    break;
            }
            idx++;
        }
        if (idx >= count || cur >= n) {
            if (cur < n)
                lineno += count_span(p + cur, n - cur);
            PyBuffer_Release(&buf);
            Py_INCREF(Py_None);
            return line_found(idx, -1, n, lineno, Py_None, Py_None);
        }
        lineno += count_span(p + cur, at - cur);
        cur = at;
        Py_ssize_t end = at < n ? line_end(p, at, n) : n;
        lineno += 1;
        Py_ssize_t len = end - at;
        key = NULL;
        if (len <= keyed) {
            key = shape_of(p + at, len);
            if (key == NULL)
                goto fail;
            int skip = plainly_inert(inert, key);
            if (skip < 0)
                goto fail;
            if (skip) {
                Py_CLEAR(key);
                cur = end + 1;
                continue;
            }
        }
        PyObject *raw = PyBytes_FromStringAndSize((const char *)p + at, len < max_line ? len : max_line);
        if (raw == NULL)
            goto fail;
        PyObject *out = line_found(idx, at, end, lineno, raw, key == NULL ? Py_None : key);
        Py_XDECREF(key);
        PyBuffer_Release(&buf);
        return out;
    }
fail:
    Py_XDECREF(key);
    PyBuffer_Release(&buf);
    return NULL;
}

/* The end of match `item` (an int, or the automaton's (pattern, start, end) tuple) into *stop: 0, else -1. */
static int match_end(PyObject *item, Py_ssize_t *stop)
{
    if (PyTuple_Check(item)) {
        if (PyTuple_GET_SIZE(item) != 3) {
            PyErr_SetString(PyExc_ValueError, "a match is not (pattern, start, end)");
            return -1;
        }
        item = PyTuple_GET_ITEM(item, 2);
    }
    *stop = PyLong_AsSsize_t(item);
    return *stop == -1 && PyErr_Occurred() ? -1 : 0;
}

/* The next head of run r into heads[r] (PY_SSIZE_T_MAX past its end): 0, else -1 (not a match end in [1, size],
 * or before the one it follows). */
static int next_head(PyObject *runs, Py_ssize_t r, Py_ssize_t *idx, Py_ssize_t *heads, Py_ssize_t size)
{
    PyObject *run = PyList_GET_ITEM(runs, r);
    Py_ssize_t before = heads[r], stop;
    if (idx[r] >= PyList_GET_SIZE(run)) {
        heads[r] = PY_SSIZE_T_MAX;
        return 0;
    }
    if (match_end(PyList_GET_ITEM(run, idx[r]), &stop) < 0)
        return -1;
    if (stop < 1 || stop > size || stop < before) {
        PyErr_SetString(PyExc_ValueError, stop < before ? "match ends out of order" : "a match end out of the block");
        return -1;
    }
    heads[r] = stop;
    idx[r]++;
    return 0;
}

/* line_starts(block, size, runs) -> [offset]
 *
 * The prefilter's candidate lines from its automata's matches in block[:size] (prefilter.line_starts, the
 * reference): `runs` holds each automaton's matches in order (lists of match ends, or of the (pattern, start, end)
 * tuples an automaton reports), merged here; for each match past the line of the one before, the start of its
 * line. No anchor holds a line end, so a match ends on its line; a match end is in [1, size]. */
static PyObject *bulk_line_starts(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t size, *idx = NULL, *heads = NULL;
    PyObject *runs, *out = NULL;
    if (!PyArg_ParseTuple(args, "y*nO!:line_starts", &buf, &size, &PyList_Type, &runs))
        return NULL;
    Py_ssize_t zero = 0, k = PyList_GET_SIZE(runs), stop_line = -1;
    if (clamp(&zero, &size, buf.len) < 0)
        goto fail;
    for (Py_ssize_t r = 0; r < k; r++)
        if (!PyList_Check(PyList_GET_ITEM(runs, r))) {
            PyErr_SetString(PyExc_TypeError, "a run of matches is not a list");
            goto fail;
        }
    idx = PyMem_Calloc((size_t)k + 1, sizeof(Py_ssize_t));
    heads = PyMem_Calloc((size_t)k + 1, sizeof(Py_ssize_t));
    if (idx == NULL || heads == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t r = 0; r < k; r++)
        if (next_head(runs, r, idx, heads, size) < 0)
            goto fail;
    if ((out = PyList_New(0)) == NULL)
        goto fail;
    const unsigned char *p = buf.buf;
    for (;;) {
        Py_ssize_t r = 0;
        for (Py_ssize_t q = 1; q < k; q++)
            if (heads[q] < heads[r])
                r = q;
        if (k == 0 || heads[r] == PY_SSIZE_T_MAX)
            break;
        Py_ssize_t stop = heads[r];
        if (next_head(runs, r, idx, heads, size) < 0)
            goto fail;
        if (stop <= stop_line)
            continue;
        const unsigned char *nl = last_byte(p, '\n', stop);
        PyObject *start = PyLong_FromSsize_t(nl == NULL ? 0 : nl - p + 1);
        if (start == NULL)
            goto fail;
        int failed = PyList_Append(out, start);
        Py_DECREF(start);
        if (failed < 0)
            goto fail;
        stop_line = line_end(p, stop - 1, size);
    }
    PyMem_Free(idx);
    PyMem_Free(heads);
    PyBuffer_Release(&buf);
    return out;
fail:
    PyMem_Free(idx);
    PyMem_Free(heads);
    Py_XDECREF(out);
    PyBuffer_Release(&buf);
    return NULL;
}

/* last_lines(block, count, end, cut, window) -> [bytes]
 *
 * The last `count` lines of block[:end] found in its last `window` bytes (file_summary.last_lines, the reference:
 * the first may be the rest of a line that starts before them), each cut to its first `cut` bytes. */
static PyObject *bulk_last_lines(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t count, end, cut, window;
    if (!PyArg_ParseTuple(args, "y*nnnn:last_lines", &buf, &count, &end, &cut, &window))
        return NULL;
    Py_ssize_t zero = 0;
    if (clamp(&zero, &end, buf.len) < 0 || count < 0 || cut < 0 || window < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "a negative count, cut or window");
        PyBuffer_Release(&buf);
        return NULL;
    }
    const unsigned char *p = buf.buf;
    Py_ssize_t floor = end > window ? end - window : 0;
    /* the pieces of p[floor:end] split at each b"\n", a last empty one left out (after a last line end): the
     * pieces of p[floor:stop], at least one, of which the last `count` are wanted */
    Py_ssize_t stop = end > floor && p[end - 1] == '\n' ? end - 1 : end, first = stop, found = 0, pos = stop;
    if (end == floor)
        count = 0;
    while (found < count) {
        const unsigned char *nl = last_byte(p + floor, '\n', pos - floor);
        found++;
        if (nl == NULL) {
            first = floor;
            break;
        }
        pos = nl - p;
        first = pos + 1;
    }
    PyObject *out = PyList_New(found);
    if (out == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    for (Py_ssize_t k = 0, at = first; k < found; k++) {
        Py_ssize_t piece_end = line_end(p, at, stop);
        Py_ssize_t len = piece_end - at;
        PyObject *piece = PyBytes_FromStringAndSize((const char *)p + at, len < cut ? len : cut);
        if (piece == NULL) {
            Py_DECREF(out);
            PyBuffer_Release(&buf);
            return NULL;
        }
        PyList_SET_ITEM(out, k, piece);
        at = piece_end + 1;
    }
    PyBuffer_Release(&buf);
    return out;
}

/* CRC-32 as zlib.crc32 computes it (reflected, polynomial 0xEDB88320), eight bytes a step through eight tables
 * (built at import): zlib.h is not there on every machine that has a compiler */
static uint32_t CRC[8][256];

static void crc_tables(void)
{
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        CRC[0][b] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int b = 0; b < 256; b++)
            CRC[t][b] = (CRC[t - 1][b] >> 8) ^ CRC[0][CRC[t - 1][b] & 0xff];
}

static uint32_t crc32_of(const unsigned char *p, Py_ssize_t len)
{
    uint32_t c = 0xFFFFFFFFu;
    for (; len >= 8; p += 8, len -= 8) {
        c ^= (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        c = CRC[7][c & 0xff] ^ CRC[6][(c >> 8) & 0xff] ^ CRC[5][(c >> 16) & 0xff] ^ CRC[4][c >> 24]
            ^ CRC[3][p[4]] ^ CRC[2][p[5]] ^ CRC[1][p[6]] ^ CRC[0][p[7]];
    }
    while (len-- > 0)
        c = CRC[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* crc32(data) -> zlib.crc32(data) */
static PyObject *bulk_crc32(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*:crc32", &buf))
        return NULL;
    uint32_t c = crc32_of(buf.buf, buf.len);
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLong(c);
}

/* what each byte is to a line's shape: KEPT unless the shape leaves it out (file_summary._DELETED: digits, the
 * control bytes but tab and line end), NOT_BLANK as well when it is kept and not a space or a tab */
#define KEPT 1
#define NOT_BLANK 2
static unsigned char SHAPE_BYTE[256];

static void shape_table(void)
{
    for (int c = 0; c < 256; c++) {
        int deleted = (c >= '0' && c <= '9') || c < 9 || (c >= 11 && c < 32) || c == 127;
        SHAPE_BYTE[c] = deleted ? 0 : (c == ' ' || c == '\t') ? KEPT : KEPT | NOT_BLANK;
    }
}

/* The shape's bytes of raw[0:len] written to out (room for len): how many; *marked ORs their SHAPE_BYTE. Without
 * a branch a byte: log lines' digits come as they please. */
static Py_ssize_t shape_bytes(const unsigned char *restrict raw, Py_ssize_t len, unsigned char *restrict out,
                              unsigned char *marked)
{
    Py_ssize_t used = 0;
    unsigned char all = 0;
    for (Py_ssize_t j = 0; j < len; j++) {
        unsigned char c = raw[j], k = SHAPE_BYTE[c];
        out[used] = c;
        used += k & KEPT;
        all |= k;
    }
    *marked |= all;
    return used;
}

/* bytes.strip's whitespace but the line ends (a piece between two \r holds neither) */
static int blank_byte(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\x0b' || c == '\x0c';
}

/* What of raw line p[0:len] (no \n, no ESC) its shape is made of (file_summary._cut_bytes): after its last \r
 * that is followed by a non-blank piece, that piece; none when every piece is blank. */
static void after_cr(const unsigned char **p, Py_ssize_t *len)
{
    const unsigned char *line = *p;
    Py_ssize_t end = *len;
    if (memchr(line, '\r', (size_t)end) == NULL)
        return;
    while (end >= 0) {
        const unsigned char *cr = last_byte(line, '\r', end);
        Py_ssize_t start = cr == NULL ? 0 : cr - line + 1;
        for (Py_ssize_t i = start; i < end; i++)
            if (!blank_byte(line[i])) {
                *p = line + start, *len = end - start;
                return;
            }
        if (cr == NULL)
            break;
        end = cr - line;
    }
    *len = 0;
}

/* tail_marks(lines, shown, own) -> (marks, last) | None
 *
 * file_summary.note_tail's marks from a file's raw last lines (`line_marks(byte_shapes(lines))`, the reference):
 * each line's shape (what follows its last non-blank \r, digits and control bytes but tab deleted), the blank
 * ones aside and those that start with one of `own` (ddpslurm's and submitit's heads) aside where others exist,
 * each one's CRC-32 packed as unsigned ints; and the last of the last `shown` lines' non-blank shapes, not an own
 * one where one is (bytes, or None). None when a line holds a line end or an escape byte: for the Python path. */
static PyObject *bulk_tail_marks(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *lines, *own, *seq, *out = NULL;
    Py_ssize_t shown;
    if (!PyArg_ParseTuple(args, "OnO!:tail_marks", &lines, &shown, &PyTuple_Type, &own))
        return NULL;
    Py_ssize_t owns = PyTuple_GET_SIZE(own);
    for (Py_ssize_t k = 0; k < owns; k++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(own, k))) {
            PyErr_SetString(PyExc_TypeError, "an own head is not bytes");
            return NULL;
        }
    if ((seq = PySequence_Fast(lines, "the lines are not a sequence")) == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), total = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_Check(items[i])) {
            PyErr_SetString(PyExc_TypeError, "a line is not bytes");
            Py_DECREF(seq);
            return NULL;
        }
        const char *raw = PyBytes_AS_STRING(items[i]);
        Py_ssize_t len = PyBytes_GET_SIZE(items[i]);
        if (memchr(raw, '\n', (size_t)len) != NULL || memchr(raw, '\x1b', (size_t)len) != NULL) {
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
        total += len;
    }
    /* the shapes, one after another in `shapes`; each line's offset, length and kind there */
    unsigned char *shapes = PyMem_Malloc((size_t)total + 1);
    Py_ssize_t *at = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(2 * n + 1));
    unsigned char *kind = PyMem_Malloc((size_t)n + 1); /* 0 blank, 1 kept, 2 own */
    if (shapes == NULL || at == NULL || kind == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t used = 0, kept = 0, mine = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned char *raw = (const unsigned char *)PyBytes_AS_STRING(items[i]);
        Py_ssize_t len = PyBytes_GET_SIZE(items[i]), start = used;
        after_cr(&raw, &len);
        unsigned char marked = 0;
        used += shape_bytes(raw, len, shapes + used, &marked);
        int blank = !(marked & NOT_BLANK);
        at[2 * i] = start, at[2 * i + 1] = used - start;
        kind[i] = 0;
        if (!blank) {
            kind[i] = 1;
            for (Py_ssize_t k = 0; k < owns; k++) {
                PyObject *head = PyTuple_GET_ITEM(own, k);
                Py_ssize_t hlen = PyBytes_GET_SIZE(head);
                if (hlen <= used - start && memcmp(shapes + start, PyBytes_AS_STRING(head), (size_t)hlen) == 0) {
                    kind[i] = 2;
                    break;
                }
            }
            kept++, mine += kind[i] == 2;
        }
    }
    int aside = mine > 0 && mine < kept; /* own lines set aside: others exist */
    PyObject *marks = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sizeof(uint32_t) * (aside ? kept - mine : kept));
    if (marks == NULL)
        goto done;
    unsigned char *m = (unsigned char *)PyBytes_AS_STRING(marks);
    Py_ssize_t before = -1; /* the line marked last: a run of lines of one shape (progress lines) is CRC'd once */
    uint32_t c = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (kind[i] == 1 || (kind[i] == 2 && !aside)) {
            if (before < 0 || at[2 * i + 1] != at[2 * before + 1]
                || memcmp(shapes + at[2 * i], shapes + at[2 * before], (size_t)at[2 * i + 1]) != 0)
                c = crc32_of(shapes + at[2 * i], at[2 * i + 1]);
            before = i;
            memcpy(m, &c, sizeof c);
            m += sizeof c;
        }
    Py_ssize_t last = -1, last_own = -1;
    for (Py_ssize_t i = n - (shown < n ? shown : n); i < n; i++) {
        if (kind[i] == 1)
            last = i;
        else if (kind[i] == 2)
            last_own = i;
    }
    if (last < 0)
        last = last_own;
    if (last < 0)
        out = Py_BuildValue("(NO)", marks, Py_None);
    else
        out = Py_BuildValue("(Ny#)", marks, shapes + at[2 * last], at[2 * last + 1]);
done:
    PyMem_Free(shapes);
    PyMem_Free(at);
    PyMem_Free(kind);
    Py_DECREF(seq);
    return out;
}

#include "_bulk_replay.h"

static PyMethodDef methods[] = {
    {"newlines", bulk_newlines, METH_VARARGS, "newlines(buffer, start, end) -> the b'\\n' in buffer[start:end]"},
    {"control_bytes", bulk_control_bytes, METH_VARARGS, "control_bytes(buffer) -> the control bytes in buffer"},
    {"shape", bulk_shape, METH_VARARGS, "shape(raw) -> raw's digits as 0, each date's century kept"},
    {"channel_key", bulk_channel_key, METH_VARARGS,
     "channel_key(buffer, start, end) -> (head, NCCL rank) of the channel line there, or None"},
    {"next_line", (PyCFunction)(void (*)(void))bulk_next_line, METH_FASTCALL,
     "next_line(block, n, cur, starts, idx, lineno, channels, inert, keyed_chars, max_line, told) -> "
     "(idx, start, end, lineno, raw, key): the next candidate line to read in Python"},
    {"line_starts", bulk_line_starts, METH_VARARGS,
     "line_starts(block, size, runs) -> the starts of the lines holding the automata's matches"},
    {"last_lines", bulk_last_lines, METH_VARARGS,
     "last_lines(block, count, end, cut, window) -> the last `count` lines of block[:end], each cut at `cut` bytes"},
    {"crc32", bulk_crc32, METH_VARARGS, "crc32(data) -> zlib.crc32(data)"},
    {"tail_marks", bulk_tail_marks, METH_VARARGS,
     "tail_marks(lines, shown, own) -> (marks, last shape) of a file's last lines, or None: the Python path"},
    {"replay_setup", bulk_replay_setup, METH_VARARGS,
     "replay_setup(new_event, shared_values, line_streams, unprefixed, host_tag, interface_fields) -> None"},
    {"replay", (PyCFunction)(void (*)(void))bulk_replay, METH_FASTCALL,
     "replay(state, plan, text, lineno) -> True (read), None (the Python path is to read it; nothing changed)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_bulk", "The scanner's per-line and per-file bulk work.", -1, methods, NULL, NULL, NULL, NULL,
};

/* the interface these functions offer: read/bulk.py takes the module only where it is the one that file expects
 * (a build left from an older source is not: pip install again), raised with any change of a function's arguments,
 * results or meaning */
#define INTERFACE 5

PyMODINIT_FUNC PyInit__bulk(void)
{
    crc_tables();
    shape_table();
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "INTERFACE", INTERFACE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
