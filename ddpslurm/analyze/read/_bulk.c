/* The scanner's per-line bulk work in compiled code: a block's candidate lines walked, each one's bounds, line
 * number and shape key found, and the lines whose reading is decided by their shape alone passed over without a
 * Python call (told NCCL channel lines, inert shapes that no digit-sensitive signature can match). Every function
 * has a pure-Python twin, the reference (read/bulk.py says which; tests/unit/test_bulk_scan.py holds them equal).
 * No Python object is touched while the GIL is released (long newline counts).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

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
static PyObject *bulk_newlines(PyObject *self, PyObject *args)
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

/* count_in(buffer, table) -> how many bytes of buffer have a nonzero entry in `table` (256 bytes) */
static PyObject *bulk_count_in(PyObject *self, PyObject *args)
{
    Py_buffer buf, table;
    if (!PyArg_ParseTuple(args, "y*y*:count_in", &buf, &table))
        return NULL;
    Py_ssize_t count = 0;
    if (table.len != 256) {
        PyErr_SetString(PyExc_ValueError, "the table is not 256 bytes");
        count = -1;
    } else {
        const unsigned char *p = buf.buf, *t = table.buf;
        for (Py_ssize_t i = 0; i < buf.len; i++)
            count += t[p[i]] != 0;
    }
    PyBuffer_Release(&buf);
    PyBuffer_Release(&table);
    return count < 0 ? NULL : PyLong_FromSsize_t(count);
}

/* The shape of raw[0:len]: digits 1-9 written as 0, then the first two bytes of each "0000-00-00" found in that
 * (left to right, without overlaps) restored as written (line_recipes.line_key's masked form). */
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
static PyObject *bulk_shape(PyObject *self, PyObject *args)
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
    if (!literal(p, &i, end, " : "))
        return 0;
    a = i;
    if ((a_end = digits(p, i, end)) == i)
        return 0;
    i = a_end;
    if (!literal(p, &i, end, "[") || (j = hexes(p, i, end)) == i)
        return 0;
    i = j;
    if (!literal(p, &i, end, "] -> "))
        return 0;
    b = i;
    if ((b_end = digits(p, i, end)) == i)
        return 0;
    i = b_end;
    if (!literal(p, &i, end, "[") || (j = hexes(p, i, end)) == i)
        return 0;
    i = j;
    if (!literal(p, &i, end, "] ["))
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

/* The key of the channel line in p[start:end] (`channel_lines.channel_key` of `_CHANNEL_LINE.search`): a new
 * (head, rank) tuple, Py_None when the line is no channel line, NULL on error. */
static PyObject *channel_key_of(const unsigned char *p, Py_ssize_t start, Py_ssize_t end)
{
    Py_ssize_t at = start, rank, rank_end;
    while (end - at >= CHANNEL_WORDS_LEN) {
        const unsigned char *hit = memmem(p + at, (size_t)(end - at), CHANNEL_WORDS, CHANNEL_WORDS_LEN);
        if (hit == NULL)
            break;
        at = hit - p;
        if (channel_rest(p, at + CHANNEL_WORDS_LEN, end, &rank, &rank_end))
            return Py_BuildValue("(y#y#)", p + start, at - start, p + rank, rank_end - rank);
        at++;
    }
    Py_RETURN_NONE;
}

/* channel_key(buffer, start, end) -> (head, rank) | None */
static PyObject *bulk_channel_key(PyObject *self, PyObject *args)
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

/* 1 when the line p[start:end] is a channel line whose key `channels` holds (file_scan's told_channel_line),
 * 0 when not, -1 on error */
static int told_channel(const unsigned char *p, Py_ssize_t start, Py_ssize_t end, Py_ssize_t max_line,
                        PyObject *channels)
{
    if (end - start > max_line)
        return 0;
    PyObject *key = channel_key_of(p, start, end);
    if (key == NULL)
        return -1;
    int told = key == Py_None ? 0 : PySet_Contains(channels, key);
    Py_DECREF(key);
    return told;
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

/* next_line(block, n, cur, starts, idx, lineno, channels, inert, keyed_chars, max_line)
 *     -> (idx, start, end, lineno, raw, key)
 *
 * From `cur` in block[:n] (whole lines), the next candidate line (`starts`: sorted line offsets, from `idx` on)
 * that is to be read in Python: candidates before `cur` passed, told channel lines passed while `channels` is not
 * empty, and lines of at most `keyed_chars` bytes whose shape `inert` remembers with nothing to ask passed too.
 * Returns its index in `starts`, its bounds, the line count up to and with it, its bytes (at most `max_line`) and
 * its shape (None when longer than `keyed_chars`); past the last one `start` is -1 and `lineno` counts to `n`. */
static PyObject *bulk_next_line(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t n, cur, idx, lineno, keyed, max_line;
    PyObject *starts, *channels, *inert, *key = NULL;
    if (!PyArg_ParseTuple(args, "y*nnO!nnO!O!nn:next_line", &buf, &n, &cur, &PyList_Type, &starts, &idx, &lineno,
                          &PySet_Type, &channels, &PyDict_Type, &inert, &keyed, &max_line))
        return NULL;
    const unsigned char *p = buf.buf;
    Py_ssize_t zero = 0;
    if (clamp(&zero, &n, buf.len) < 0 || cur < 0 || idx < 0 || max_line < 0)
        goto fail;
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
                int told = told_channel(p, at, line_end(p, at, n), max_line, channels);
                if (told < 0)
                    goto fail;
                if (!told)
                    break;
            }
            idx++;
        }
        if (idx >= count || cur >= n) {
            if (cur < n)
                lineno += count_span(p + cur, n - cur);
            PyBuffer_Release(&buf);
            return Py_BuildValue("(nnnnOO)", idx, (Py_ssize_t)-1, n, lineno, Py_None, Py_None);
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
        PyObject *out = Py_BuildValue("(nnnnNO)", idx, at, end, lineno, raw, key == NULL ? Py_None : key);
        Py_XDECREF(key);
        PyBuffer_Release(&buf);
        return out;
    }
fail:
    Py_XDECREF(key);
    PyBuffer_Release(&buf);
    return NULL;
}

static PyMethodDef methods[] = {
    {"newlines", bulk_newlines, METH_VARARGS, "newlines(buffer, start, end) -> the b'\\n' in buffer[start:end]"},
    {"count_in", bulk_count_in, METH_VARARGS, "count_in(buffer, table) -> the bytes with a nonzero table entry"},
    {"shape", bulk_shape, METH_VARARGS, "shape(raw) -> raw's digits as 0, each date's century kept"},
    {"channel_key", bulk_channel_key, METH_VARARGS,
     "channel_key(buffer, start, end) -> (head, NCCL rank) of the channel line there, or None"},
    {"next_line", bulk_next_line, METH_VARARGS,
     "next_line(block, n, cur, starts, idx, lineno, channels, inert, keyed_chars, max_line) -> "
     "(idx, start, end, lineno, raw, key): the next candidate line to read in Python"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_bulk", "The scanner's per-line bulk work.", -1, methods};

PyMODINIT_FUNC PyInit__bulk(void)
{
    return PyModule_Create(&module);
}
