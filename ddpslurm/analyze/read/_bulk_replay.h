/* A remembered line shape's reading replayed in compiled code: `replay(state, plan, text, lineno)` does what
 * parse/line_recipes.py `RememberedShapes.replay` does (its pure twin, the reference) for a line of a shape whose
 * recipe `compiled_plan` could write as a plan: the prefixes' values read from the recipe's spans, the stream the
 * line speaks for taken (line_streams.py `_take_prefix`), the signature's groups, NCCL's `host:pid` head and a
 * `[Rank N]` tag read from theirs, and the event made as `_signature_event` and `_emit` make it (its glog time read
 * here where the recipe's time plan says where it is; any other time by the state's own `_time`).
 * Returns True when the line was read, None when this line is one the Python path is to read (a line that may
 * continue the one above it, text not ASCII, spans the line cannot hold): then nothing was changed. A time not at
 * its planned place is read by the state's `_time`. Included by _bulk.c. */

/* what `replay_setup` was given: new_event, the modules whose CANONICAL and MAX_CANONICAL (shared_values) and
 * MAX_RANK_LIST (line_streams) are read at each call (as the Python path reads them), UNPREFIXED, HOST_TAG,
 * interface_fields */
static PyObject *R_new_event, *R_shared, *R_streams, *R_unprefixed, *R_host_tag, *R_interface_fields;
/* during one call: the shared values' memo (borrowed) and its limit, the ranks a summary lists at most */
static PyObject *R_memo;
static Py_ssize_t R_max_memo, R_max_ranks;
/* interned names and constants */
static PyObject *N_source, *N_summary, *N_streams, *N_stream_lines, *N_handled, *N_stream_now, *N_previous,
    *N_label_rank, *N_prefix_rank, *N_tag_hosts, *N_carried_hosts, *N_year, *N_events, *N_rank_maps, *N_time,
    *N_display, *N_rank, *N_local_rank, *N_host, *N_kind, *N_task_file, *N_ranks_seen, *N_torchrun, *C_one,
    *C_srun_task, *C_accuses, *C_log, *C_glog, *N_canonical, *N_max_canonical, *N_max_rank_list;

static int replay_ready = 0;

static PyObject *intern_name(const char *name)
{
    return PyUnicode_InternFromString(name);
}

/* replay_setup(new_event, shared_values, line_streams, unprefixed, host_tag, interface_fields) -> None */
static PyObject *bulk_replay_setup(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *new_event, *shared, *streams, *unprefixed, *host_tag, *interface_fields;
    if (!PyArg_ParseTuple(args, "OOOOUO", &new_event, &shared, &streams, &unprefixed, &host_tag, &interface_fields))
        return NULL;
    if (!PyCallable_Check(new_event) || !PyCallable_Check(interface_fields)) {
        PyErr_SetString(PyExc_TypeError, "replay_setup: new_event and interface_fields are callables");
        return NULL;
    }
    if (!replay_ready) {
        const char *names[] = {"source", "summary", "streams", "stream_lines", "handled", "stream_now", "previous",
                               "label_rank", "prefix_rank", "tag_hosts", "carried_hosts", "year", "events",
                               "rank_maps", "_time", "display", "rank", "local_rank", "host", "kind", "task_file",
                               "ranks_seen", "torchrun", "1", "srun_task", "accuses", "log", "glog", "CANONICAL",
                               "MAX_CANONICAL", "MAX_RANK_LIST"};
        PyObject **slots[] = {&N_source, &N_summary, &N_streams, &N_stream_lines, &N_handled, &N_stream_now,
                              &N_previous, &N_label_rank, &N_prefix_rank, &N_tag_hosts, &N_carried_hosts, &N_year,
                              &N_events, &N_rank_maps, &N_time, &N_display, &N_rank, &N_local_rank, &N_host,
                              &N_kind, &N_task_file, &N_ranks_seen, &N_torchrun, &C_one, &C_srun_task, &C_accuses,
                              &C_log, &C_glog, &N_canonical, &N_max_canonical, &N_max_rank_list};
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            *slots[i] = intern_name(names[i]);
            if (*slots[i] == NULL)
                return NULL;
        }
    }
    PyObject **held[] = {&R_new_event, &R_shared, &R_streams, &R_unprefixed, &R_host_tag, &R_interface_fields};
    PyObject *given[] = {new_event, shared, streams, unprefixed, host_tag, interface_fields};
    for (int i = 0; i < 6; i++) {
        Py_INCREF(given[i]);
        Py_XSETREF(*held[i], given[i]);
    }
    replay_ready = 1;
    Py_RETURN_NONE;
}

/* The modules' values of this call into R_memo (a new reference: the caller releases it), R_max_memo and
 * R_max_ranks: 0, or -1 with an error set. */
static int call_limits(void)
{
    PyObject *limit = NULL, *ranks = NULL;
    R_memo = PyObject_GetAttr(R_shared, N_canonical);
    if (R_memo == NULL || !PyDict_Check(R_memo) || (limit = PyObject_GetAttr(R_shared, N_max_canonical)) == NULL
        || (ranks = PyObject_GetAttr(R_streams, N_max_rank_list)) == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "replay: shared_values.CANONICAL is a dict");
        Py_CLEAR(R_memo);
        Py_XDECREF(limit);
        return -1;
    }
    R_max_memo = PyLong_AsSsize_t(limit);
    R_max_ranks = PyLong_AsSsize_t(ranks);
    Py_DECREF(limit);
    Py_DECREF(ranks);
    if (PyErr_Occurred()) {
        Py_CLEAR(R_memo);
        return -1;
    }
    return 0;
}

/* The int written at p[0:len] (ASCII digits, as a digit group holds: `int(text[a:b])`), or NULL (with no error set
 * where p[0:len] is empty or not all digits). */
static PyObject *digits_int(const char *p, Py_ssize_t len)
{
    if (len <= 0)
        return NULL;
    long long v = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        if (p[i] < '0' || p[i] > '9')
            return NULL;
        if (len <= 18)  /* a longer number is read by PyLong_FromString below */
            v = v * 10 + (p[i] - '0');
    }
    if (len <= 18)
        return PyLong_FromLongLong(v);
    char *copy = PyMem_Malloc(len + 1);
    if (copy == NULL)
        return PyErr_NoMemory();
    memcpy(copy, p, len);
    copy[len] = 0;
    char *end = NULL;
    PyObject *out = PyLong_FromString(copy, &end, 10);
    if (out != NULL && end != copy + len)
        Py_CLEAR(out);
    PyMem_Free(copy);
    if (out == NULL)
        PyErr_Clear();
    return out;
}

/* `small_int` (parse/line_events.py) of text p[0:len]: its int where it is 1 to 18 ASCII digits, else None
 * (a new reference either way). */
static PyObject *small_int_of(const char *p, Py_ssize_t len)
{
    if (len < 1 || len > 18) {
        Py_RETURN_NONE;
    }
    PyObject *out = digits_int(p, len);
    if (out == NULL && !PyErr_Occurred()) {
        Py_RETURN_NONE;
    }
    return out;
}

static Py_ssize_t tuple_size(PyObject *t, Py_ssize_t i)
{
    return PyLong_AsSsize_t(PyTuple_GET_ITEM(t, i));
}

/* Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar (datetime.date's). */
static long long days_from_civil(long long y, unsigned m, unsigned d)
{
    y -= m <= 2;
    const long long era = (y >= 0 ? y : y - 399) / 400;
    const unsigned yoe = (unsigned)(y - era * 400);
    const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (long long)doe - 719468;
}

static int two(const char *p, char lo0, char hi0, int *out)
{
    if (p[0] < lo0 || p[0] > hi0 || p[1] < '0' || p[1] > '9')
        return 0;
    *out = (p[0] - '0') * 10 + (p[1] - '0');
    return 1;
}

static int is_word(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/* The rest of a glog time from its day on (p[at:n]): `(?P<d>[0-3]\d) (?P<h>[0-2]\d):(?P<mi>[0-5]\d):(?P<s>[0-6]\d)`
 * then `(?:\.(?P<frac>\d{1,9}))?`; 1 and the values, else 0. */
static int glog_rest(const char *p, Py_ssize_t at, Py_ssize_t n, int *d, int *h, int *mi, int *s,
                     Py_ssize_t *frac, Py_ssize_t *frac_len)
{
    if (n - at < 11 || !two(p + at, '0', '3', d) || p[at + 2] != ' ' || !two(p + at + 3, '0', '2', h)
        || p[at + 5] != ':' || !two(p + at + 6, '0', '5', mi) || p[at + 8] != ':' || !two(p + at + 9, '0', '6', s))
        return 0;
    Py_ssize_t i = at + 11;
    *frac = i + 1;
    *frac_len = 0;
    if (i < n && p[i] == '.')
        while (*frac_len < 9 && i + 1 + *frac_len < n && p[i + 1 + *frac_len] >= '0' && p[i + 1 + *frac_len] <= '9')
            (*frac_len)++;
    return 1;
}

/* `_read_glog(body, at, year)` (parse/timestamps.py) where `_GLOG` matches at `at` itself: 1 and the seconds;
 * 0 where it does not match there (or the year is one calendar.timegm refuses): the caller asks Python. The
 * month's alternatives are tried in the regex's order (`1[0-2]`, then `0?[1-9]` with and without its 0). */
static int glog_at(const char *p, Py_ssize_t n, Py_ssize_t at, long long year, double *seconds)
{
    if (at < 0 || at + 1 >= n || (at > 0 && is_word(p[at - 1])) || !strchr("IWEF", p[at]) || p[at] == 0)
        return 0;
    if (year < 1 || year > 9999)
        return 0;
    Py_ssize_t m = at + 1;
    int months[3], ends[3], tries = 0;
    if (m + 1 < n && p[m] == '1' && p[m + 1] >= '0' && p[m + 1] <= '2') {
        months[tries] = 10 + (p[m + 1] - '0');
        ends[tries++] = 2;
    }
    if (m + 1 < n && p[m] == '0' && p[m + 1] >= '1' && p[m + 1] <= '9') {
        months[tries] = p[m + 1] - '0';
        ends[tries++] = 2;
    }
    if (p[m] >= '1' && p[m] <= '9') {
        months[tries] = p[m] - '0';
        ends[tries++] = 1;
    }
    for (int t = 0; t < tries; t++) {
        int d, h, mi, s;
        Py_ssize_t frac, frac_len;
        if (!glog_rest(p, m + ends[t], n, &d, &h, &mi, &s, &frac, &frac_len))
            continue;
        long long days = days_from_civil(year, (unsigned)months[t], 1);
        long long base = (((days + d - 1) * 24 + h) * 60 + mi) * 60 + (s < 59 ? s : 59);
        double value = (double)base;
        if (frac_len > 0) {
            char text[12] = "0.";
            memcpy(text + 2, p + frac, frac_len);
            text[2 + frac_len] = 0;
            double f = PyOS_string_to_double(text, NULL, NULL);
            if (f == -1.0 && PyErr_Occurred())
                return -1;
            value += f;
        }
        *seconds = value;
        return 1;
    }
    return 0;
}

/* A new str of text[a:b]. */
static PyObject *piece_of(PyObject *text, Py_ssize_t a, Py_ssize_t b)
{
    return PyUnicode_Substring(text, a, b);
}

/* `shared_values.canonical`: one shared object for equal values (new reference). */
static PyObject *canonical_of(PyObject *value)
{
    if (value == Py_None) {
        Py_RETURN_NONE;
    }
    PyObject *found = PyDict_GetItemWithError(R_memo, value);
    if (found != NULL) {
        Py_INCREF(found);
        return found;
    }
    if (PyErr_Occurred())
        return NULL;
    if (R_max_memo > 0) {
        if (PyDict_GET_SIZE(R_memo) >= R_max_memo)
            PyDict_Clear(R_memo);
        if (PyDict_SetItem(R_memo, value, value) < 0)
            return NULL;
    }
    Py_INCREF(value);
    return value;
}

/* `shared_values.canonical_fields` of the list of pairs `pairs` (new reference to a tuple). */
static PyObject *canonical_fields_of(PyObject *pairs)
{
    PyObject *fields = PyList_AsTuple(pairs);
    if (fields == NULL)
        return NULL;
    PyObject *found = PyDict_GetItemWithError(R_memo, fields);
    if (found != NULL) {
        Py_INCREF(found);
        Py_DECREF(fields);
        return found;
    }
    if (PyErr_Occurred())
        goto fail;
    Py_ssize_t count = PyTuple_GET_SIZE(fields);
    if (PyDict_GET_SIZE(R_memo) + count >= R_max_memo)
        PyDict_Clear(R_memo);
    PyObject *shared = PyTuple_New(count);
    if (shared == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *pair = PyDict_SetDefault(R_memo, PyTuple_GET_ITEM(fields, i), PyTuple_GET_ITEM(fields, i));
        if (pair == NULL) {
            Py_DECREF(shared);
            goto fail;
        }
        Py_INCREF(pair);
        PyTuple_SET_ITEM(shared, i, pair);
    }
    Py_DECREF(fields);
    PyObject *out = PyDict_SetDefault(R_memo, shared, shared);
    Py_XINCREF(out);
    Py_DECREF(shared);
    return out;
fail:
    Py_DECREF(fields);
    return NULL;
}

/* The values a plan reads from one line before anything is changed: what `Prefix` says, the body, the groups, NCCL's
 * head and a `[Rank N]` tag. References owned. */
typedef struct {
    PyObject *rank, *local, *host, *time_text, *label, *body;
    int from_label;
    PyObject *groups;   /* dict name -> str */
    PyObject *ns_host, *ns_pid;  /* NULL: no head */
    PyObject *named;
} LineValues;

static void values_clear(LineValues *v)
{
    Py_CLEAR(v->rank);
    Py_CLEAR(v->local);
    Py_CLEAR(v->host);
    Py_CLEAR(v->time_text);
    Py_CLEAR(v->label);
    Py_CLEAR(v->body);
    Py_CLEAR(v->groups);
    Py_CLEAR(v->ns_host);
    Py_CLEAR(v->ns_pid);
    Py_CLEAR(v->named);
}

/* The number at span (a, b) of text (or None for a == -1), a new reference; NULL with an error set or, without
 * one, where it is no number (the Python path reads the line). */
static PyObject *span_number(const char *p, Py_ssize_t len, Py_ssize_t a, Py_ssize_t b)
{
    if (a < 0) {
        Py_RETURN_NONE;
    }
    if (b > len || a > b)
        return NULL;
    return digits_int(p + a, b - a);
}

static PyObject *span_piece(PyObject *text, Py_ssize_t len, Py_ssize_t a, Py_ssize_t b)
{
    if (a < 0) {
        Py_RETURN_NONE;
    }
    if (b > len || a > b)
        return NULL;
    return piece_of(text, a, b);
}

/* Reads the line's values by the plan; 1 read, 0 not readable so (nothing set that matters), -1 an error. */
static int read_values(PyObject *plan, PyObject *text, const char *p, Py_ssize_t len, LineValues *v)
{
    PyObject *spans = PyTuple_GET_ITEM(plan, 0);
    Py_ssize_t s[11];
    for (int i = 0; i < 11; i++) {
        s[i] = tuple_size(spans, i);
        if (s[i] == -1 && PyErr_Occurred())
            return -1;
    }
    Py_ssize_t start = s[0];
    if (start < 0 || start > len)
        return 0;
    if ((v->rank = span_number(p, len, s[1], s[2])) == NULL || (v->local = span_number(p, len, s[3], s[4])) == NULL
        || (v->label = span_number(p, len, s[9], s[10])) == NULL || (v->host = span_piece(text, len, s[5], s[6])) == NULL
        || (v->time_text = span_piece(text, len, s[7], s[8])) == NULL)
        return PyErr_Occurred() ? -1 : 0;
    v->from_label = v->rank == Py_None && v->label != Py_None && v->local == Py_None;
    if (v->from_label) {
        Py_INCREF(v->label);
        Py_SETREF(v->rank, v->label);
    }
    if ((v->body = piece_of(text, start, len)) == NULL)
        return -1;
    const char *b = p + start;
    Py_ssize_t blen = len - start;
    PyObject *groups = PyTuple_GET_ITEM(plan, 5);
    if ((v->groups = PyDict_New()) == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(groups); i++) {
        PyObject *g = PyTuple_GET_ITEM(groups, i);
        Py_ssize_t a = tuple_size(g, 1), e = tuple_size(g, 2);
        if ((a == -1 || e == -1) && PyErr_Occurred())
            return -1;
        if (a < 0 || e > blen || a > e)
            return 0;
        PyObject *value = piece_of(v->body, a, e);
        if (value == NULL || PyDict_SetItem(v->groups, PyTuple_GET_ITEM(g, 0), value) < 0) {
            Py_XDECREF(value);
            return -1;
        }
        Py_DECREF(value);
    }
    PyObject *ns = PyTuple_GET_ITEM(plan, 6);
    if (ns != Py_None) {
        Py_ssize_t h0 = tuple_size(ns, 0), h1 = tuple_size(ns, 1), p0 = tuple_size(ns, 2), p1 = tuple_size(ns, 3);
        if (PyErr_Occurred())
            return -1;
        if (h0 < 0 || p0 < 0 || h1 > blen || p1 > blen || h0 > h1 || p0 > p1)
            return 0;
        if ((v->ns_host = piece_of(v->body, h0, h1)) == NULL)
            return -1;
        if ((v->ns_pid = digits_int(b + p0, p1 - p0)) == NULL)
            return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *tag = PyTuple_GET_ITEM(plan, 7);
    if (tag == Py_None) {
        v->named = Py_None;
        Py_INCREF(Py_None);
    } else {
        Py_ssize_t a = tuple_size(tag, 0), e = tuple_size(tag, 1);
        if (PyErr_Occurred())
            return -1;
        if (a < 0 || e > blen || a > e)
            return 0;
        if ((v->named = digits_int(b + a, e - a)) == NULL)
            return PyErr_Occurred() ? -1 : 0;
    }
    return 1;
}

static int set_attr_ssize(PyObject *obj, PyObject *name, Py_ssize_t value)
{
    PyObject *v = PyLong_FromSsize_t(value);
    if (v == NULL)
        return -1;
    int out = PyObject_SetAttr(obj, name, v);
    Py_DECREF(v);
    return out;
}

/* set.add(item) on the state's set attribute `name` */
static int add_to(PyObject *state, PyObject *name, PyObject *item)
{
    PyObject *set = PyObject_GetAttr(state, name);
    if (set == NULL)
        return -1;
    int out = PySet_Check(set) ? PySet_Add(set, item) : -1;
    if (out < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "replay: a set expected");
    Py_DECREF(set);
    return out;
}

/* whether item is in the state's set attribute `name` (1, 0; -1 an error) */
static int held_in(PyObject *state, PyObject *name, PyObject *item)
{
    PyObject *set = PyObject_GetAttr(state, name);
    if (set == NULL)
        return -1;
    int out = PySet_Check(set) ? PySet_Contains(set, item) : PySequence_Contains(set, item);
    Py_DECREF(set);
    return out;
}

/* What `_take_prefix` returns, and what it leaves for `_emit` (the line's srun label and prefix rank). */
typedef struct {
    PyObject *rank, *local, *host, *stream, *label_rank, *prefix_rank;
} Taken;

static void taken_clear(Taken *t)
{
    Py_CLEAR(t->rank);
    Py_CLEAR(t->local);
    Py_CLEAR(t->host);
    Py_CLEAR(t->stream);
    Py_CLEAR(t->label_rank);
    Py_CLEAR(t->prefix_rank);
}

/* `_take_prefix` of a line that continues no other (the caller made sure): 0, or -1 with an error set. */
static int take_prefix(PyObject *state, PyObject *source, PyObject *summary, LineValues *v, int host_tag, int slurm,
                       Py_ssize_t lineno, Taken *t)
{
    int ok = -1;
    PyObject *src_rank = NULL, *src_local = NULL, *src_host = NULL, *info = NULL, *lines = NULL, *previous = NULL;
    PyObject *streams = NULL, *stream_lines = NULL, *handled = NULL;
    if ((src_rank = PyObject_GetAttr(source, N_rank)) == NULL
        || (src_local = PyObject_GetAttr(source, N_local_rank)) == NULL
        || (src_host = PyObject_GetAttr(source, N_host)) == NULL)
        goto done;
    int host_given = v->host != Py_None && PyUnicode_GET_LENGTH(v->host) > 0;
    t->rank = Py_NewRef(v->rank != Py_None ? v->rank : src_rank);
    t->local = Py_NewRef(v->local != Py_None ? v->local : src_local);
    t->host = Py_NewRef(host_given ? v->host : src_host);
    int tag = 0;
    if (host_tag && v->host != Py_None) {
        tag = PyObject_RichCompareBool(v->host, src_host, Py_NE);
        if (tag < 0)
            goto done;
    }
    if (tag) {
        if (add_to(state, N_tag_hosts, v->host) < 0)
            goto done;
    } else if (t->host != Py_None && add_to(state, N_carried_hosts, t->host) < 0)
        goto done;
    if (v->rank != Py_None && summary != Py_None) {
        PyObject *seen = PyObject_GetAttr(summary, N_ranks_seen);
        if (seen == NULL)
            goto done;
        Py_ssize_t size = PyObject_Size(seen);
        int add = size >= 0 && size < R_max_ranks;
        if (add) {
            add = PyObject_RichCompareBool(v->rank, src_rank, Py_NE);
            if (add == 0) {
                PyObject *kind = PyObject_GetAttr(source, N_kind);
                add = kind == NULL ? -1 : PyObject_RichCompareBool(kind, C_log, Py_NE);
                Py_XDECREF(kind);
            }
        }
        if (size < 0 || add < 0 || (add && (!PySet_Check(seen) || PySet_Add(seen, v->rank) < 0))) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "replay: ranks_seen is a set");
            Py_DECREF(seen);
            goto done;
        }
        Py_DECREF(seen);
    }
    if (slurm) {
        Py_SETREF(t->rank, Py_NewRef(v->rank));
        Py_SETREF(t->local, Py_NewRef(v->local));
        Py_SETREF(t->host, Py_NewRef(v->host));
    }
    t->label_rank = Py_NewRef(v->from_label ? v->rank : Py_None);
    t->prefix_rank = Py_NewRef(v->from_label ? Py_None : v->rank);
    if (PyObject_SetAttr(state, N_label_rank, t->label_rank) < 0 || PyObject_SetAttr(state, N_prefix_rank, t->prefix_rank) < 0)
        goto done;
    if ((t->stream = PyTuple_Pack(3, v->rank, v->local, v->host)) == NULL
        || (info = PyTuple_Pack(5, t->rank, t->local, t->host, t->label_rank, t->prefix_rank)) == NULL
        || (streams = PyObject_GetAttr(state, N_streams)) == NULL || !PyDict_Check(streams)
        || PyDict_SetItem(streams, t->stream, info) < 0)
        goto done;
    if ((handled = PyObject_GetAttr(state, N_handled)) == NULL)
        goto done;
    Py_ssize_t count = PyLong_AsSsize_t(handled);
    if ((count == -1 && PyErr_Occurred()) || set_attr_ssize(state, N_handled, count + 1) < 0)
        goto done;
    if ((stream_lines = PyObject_GetAttr(state, N_stream_lines)) == NULL || !PyDict_Check(stream_lines))
        goto done;
    lines = PyDict_GetItemWithError(stream_lines, t->stream);
    Py_ssize_t before = 0;
    if (lines != NULL) {
        before = PyLong_AsSsize_t(lines);
        if (before == -1 && PyErr_Occurred())
            goto done;
    } else if (PyErr_Occurred())
        goto done;
    lines = PyLong_FromSsize_t(before + 1);
    if (lines == NULL || PyDict_SetItem(stream_lines, t->stream, lines) < 0)
        goto done;
    if (PyObject_SetAttr(state, N_stream_now, t->stream) < 0)
        goto done;
    if ((previous = Py_BuildValue("(nO)", lineno, t->stream)) == NULL || PyObject_SetAttr(state, N_previous, previous) < 0)
        goto done;
    ok = 0;
done:
    if (ok < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "replay: the state's streams and stream_lines are dicts");
    Py_XDECREF(src_rank);
    Py_XDECREF(src_local);
    Py_XDECREF(src_host);
    Py_XDECREF(info);
    Py_XDECREF(lines);
    Py_XDECREF(previous);
    Py_XDECREF(streams);
    Py_XDECREF(stream_lines);
    Py_XDECREF(handled);
    return ok;
}

/* groups.get(name) (borrowed; NULL for none) */
static PyObject *group(LineValues *v, const char *name)
{
    return PyDict_GetItemString(v->groups, name);
}

static PyObject *small_int_group(LineValues *v, const char *name)
{
    PyObject *value = group(v, name);
    if (value == NULL || !PyUnicode_IS_ASCII(value)) {
        Py_RETURN_NONE;
    }
    return small_int_of((const char *)PyUnicode_DATA(value), PyUnicode_GET_LENGTH(value));
}

/* The line's time and its family (new references), as `LineEvents._time` reads it: a glog time at the planned
 * offset here, any other by `_time` itself. 0, or -1 with an error set. */
static int line_time(PyObject *state, LineValues *v, PyObject *plan_time, PyObject **time, PyObject **family)
{
    if (v->time_text == Py_None && plan_time == Py_None) {
        *time = Py_NewRef(Py_None);
        *family = Py_NewRef(Py_None);
        return 0;
    }
    if (v->time_text == Py_None && PyTuple_Check(plan_time) && PyTuple_GET_SIZE(plan_time) == 2) {
        Py_ssize_t form = tuple_size(plan_time, 0), at = tuple_size(plan_time, 1);
        PyObject *year = PyObject_GetAttr(state, N_year);
        if (year == NULL)
            return -1;
        long long y = year == Py_None ? 0 : PyLong_AsLongLong(year);
        Py_DECREF(year);
        if (PyErr_Occurred())
            return -1;
        double seconds;
        int found = form == 1 && y > 0 ? glog_at((const char *)PyUnicode_DATA(v->body), PyUnicode_GET_LENGTH(v->body),
                                                 at, y, &seconds) : 0;
        if (found < 0)
            return -1;
        if (found) {
            if ((*time = PyFloat_FromDouble(seconds)) == NULL)
                return -1;
            *family = Py_NewRef(C_glog);
            return 0;
        }
    }
    PyObject *found = PyObject_CallMethodObjArgs(state, N_time, v->time_text, v->body, plan_time, NULL);
    if (found == NULL)
        return -1;
    if (!PyTuple_Check(found) || PyTuple_GET_SIZE(found) != 2) {
        Py_DECREF(found);
        PyErr_SetString(PyExc_TypeError, "replay: _time returns (time, family)");
        return -1;
    }
    *time = Py_NewRef(PyTuple_GET_ITEM(found, 0));
    *family = Py_NewRef(PyTuple_GET_ITEM(found, 1));
    Py_DECREF(found);
    return 0;
}

static int append_pair(PyObject *pairs, PyObject *name, PyObject *value)
{
    PyObject *pair = PyTuple_Pack(2, name, value);
    if (pair == NULL)
        return -1;
    int out = PyList_Append(pairs, pair);
    Py_DECREF(pair);
    return out;
}

/* `_signature_event` and `_emit` of the line, after its prefix was taken: 0, or -1 with an error set. */
static int signature_event(PyObject *state, PyObject *source, PyObject *sig, PyObject *plan_time, LineValues *v,
                           Taken *t, Py_ssize_t lineno)
{
    int ok = -1;
    PyObject *kind = PyTuple_GET_ITEM(sig, 0), *cause = PyTuple_GET_ITEM(sig, 2), *role = PyTuple_GET_ITEM(sig, 3),
             *id = PyTuple_GET_ITEM(sig, 4), *priority = PyTuple_GET_ITEM(sig, 5), *accuses = PyTuple_GET_ITEM(sig, 6);
    int failure = PyObject_IsTrue(PyTuple_GET_ITEM(sig, 1)), rank_from_groups = PyObject_IsTrue(PyTuple_GET_ITEM(sig, 7)),
        rank_map = PyObject_IsTrue(PyTuple_GET_ITEM(sig, 8)), interface = PyObject_IsTrue(PyTuple_GET_ITEM(sig, 9));
    PyObject *rank = Py_NewRef(t->rank), *local = Py_NewRef(t->local), *ev_host = NULL, *pid = NULL, *key = NULL;
    PyObject *pairs = NULL, *time = NULL, *family = NULL, *display = NULL, *text = NULL, *host = NULL, *fields = NULL;
    PyObject *event = NULL, *events = NULL;
    PyObject *carried = v->ns_host != NULL && PyUnicode_GET_LENGTH(v->ns_host) > 0 ? v->ns_host : group(v, "host");
    int carried_true = carried != NULL && PyObject_IsTrue(carried) > 0;
    if (carried_true && add_to(state, N_carried_hosts, carried) < 0)
        goto done;
    int take_carried = 0;
    if (carried_true) {
        take_carried = t->host == Py_None ? 1 : held_in(state, N_tag_hosts, t->host);
        if (take_carried < 0)
            goto done;
    }
    ev_host = Py_NewRef(take_carried ? carried : t->host);
    pid = v->ns_host != NULL ? Py_NewRef(v->ns_pid) : small_int_group(v, "pid");
    if (pid == NULL)
        goto done;
    if (rank == Py_None && rank_from_groups) {
        Py_SETREF(rank, small_int_group(v, "rank"));
        if (rank == NULL)
            goto done;
    }
    if (rank == Py_None && v->ns_host == NULL)
        Py_SETREF(rank, Py_NewRef(v->named));
    if (local == Py_None) {
        Py_SETREF(local, small_int_group(v, "local_rank"));
        if (local == NULL)
            goto done;
    }
    if (rank_map) {
        PyObject *nccl_rank = group(v, "nccl_rank"), *nranks = group(v, "nranks");
        if ((key = PyTuple_Pack(4, ev_host, pid, nccl_rank ? nccl_rank : Py_None, nranks ? nranks : Py_None)) == NULL)
            goto done;
        int told = held_in(state, N_rank_maps, key);
        if (told < 0 || (!told && add_to(state, N_rank_maps, key) < 0))
            goto done;
        if (told) {
            ok = 0;
            goto done;
        }
    }
    if (interface) {
        PyObject *ifname = group(v, "ifname"), *ip = group(v, "ip");
        if (ifname == NULL || ip == NULL) {
            PyErr_SetString(PyExc_KeyError, "ifname");
            goto done;
        }
        PyObject *more = PyObject_CallFunctionObjArgs(R_interface_fields, v->body, ifname, ip, NULL);
        if (more == NULL || PyDict_Update(v->groups, more) < 0) {
            Py_XDECREF(more);
            goto done;
        }
        Py_DECREF(more);
    }
    if ((pairs = PyDict_Items(v->groups)) == NULL || PyList_Sort(pairs) < 0)
        goto done;
    if (line_time(state, v, plan_time, &time, &family) < 0)
        goto done;
    if (rank != Py_None) {
        int same = PyObject_RichCompareBool(rank, t->label_rank, Py_EQ);
        if (same == 0 && t->prefix_rank == Py_None) {
            int task_file = 0;
            PyObject *flag = PyObject_GetAttr(source, N_task_file);
            if (flag == NULL || (task_file = PyObject_IsTrue(flag)) < 0) {
                Py_XDECREF(flag);
                goto done;
            }
            Py_DECREF(flag);
            if (task_file) {
                PyObject *src_rank = PyObject_GetAttr(source, N_rank);
                same = src_rank == NULL ? -1 : PyObject_RichCompareBool(rank, src_rank, Py_EQ);
                Py_XDECREF(src_rank);
            }
        }
        if (same < 0)
            goto done;
        if (same) {
            PyObject *told = PyObject_Str(rank);
            if (told == NULL || append_pair(pairs, C_srun_task, told) < 0) {
                Py_XDECREF(told);
                goto done;
            }
            Py_DECREF(told);
        }
    }
    if (ev_host != Py_None) {
        int tagged = held_in(state, N_tag_hosts, ev_host);
        if (tagged > 0)
            tagged = !held_in(state, N_carried_hosts, ev_host);  /* (an error there is caught below) */
        if (PyErr_Occurred() || (tagged && append_pair(pairs, R_host_tag, C_one) < 0))
            goto done;
    }
    if (failure && append_pair(pairs, C_accuses, accuses) < 0)
        goto done;
    if ((display = PyObject_GetAttr(source, N_display)) == NULL)
        goto done;
    Py_ssize_t blen = PyUnicode_GET_LENGTH(v->body);
    if ((text = blen > 2000 ? PyUnicode_Substring(v->body, 0, 2000) : Py_NewRef(v->body)) == NULL
        || (host = canonical_of(ev_host)) == NULL || (fields = canonical_fields_of(pairs)) == NULL)
        goto done;
    PyObject *line = PyLong_FromSsize_t(lineno);
    if (line == NULL)
        goto done;
    PyObject *argv[15] = {display, line, kind, text, rank, host, pid, local, time, family, failure ? cause : Py_None,
                          failure ? role : Py_None, id, priority, fields};
    event = PyObject_Vectorcall(R_new_event, argv, 15, NULL);
    Py_DECREF(line);
    if (event == NULL || (events = PyObject_GetAttr(state, N_events)) == NULL || PyList_Append(events, event) < 0)
        goto done;
    ok = 0;
done:
    Py_XDECREF(rank);
    Py_XDECREF(local);
    Py_XDECREF(ev_host);
    Py_XDECREF(pid);
    Py_XDECREF(key);
    Py_XDECREF(pairs);
    Py_XDECREF(time);
    Py_XDECREF(family);
    Py_XDECREF(display);
    Py_XDECREF(text);
    Py_XDECREF(host);
    Py_XDECREF(fields);
    Py_XDECREF(event);
    Py_XDECREF(events);
    return ok;
}

/* Whether the line may continue the one above it (`_take_prefix`'s first branch asks `continues` then): a line
 * without a rank or host prefix right after a line of a prefixed stream. 1, 0, -1 an error. */
static int may_continue(PyObject *state, LineValues *v, Py_ssize_t lineno)
{
    if (v->rank != Py_None || v->host != Py_None)
        return 0;
    PyObject *previous = PyObject_GetAttr(state, N_previous);
    if (previous == NULL)
        return -1;
    int out = 1;  /* anything unexpected: the Python path decides */
    if (PyTuple_Check(previous) && PyTuple_GET_SIZE(previous) == 2) {
        Py_ssize_t before = PyLong_AsSsize_t(PyTuple_GET_ITEM(previous, 0));
        if (before == -1 && PyErr_Occurred())
            PyErr_Clear();
        else if (before != lineno - 1)
            out = 0;
        else
            out = PyObject_RichCompareBool(PyTuple_GET_ITEM(previous, 1), R_unprefixed, Py_NE);
    }
    Py_DECREF(previous);
    return out;
}

/* replay(state, plan, text, lineno) -> True (read), None (the Python path is to read it: nothing changed) */
static PyObject *bulk_replay(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "replay takes 4 arguments");
        return NULL;
    }
    if (!replay_ready) {
        PyErr_SetString(PyExc_RuntimeError, "replay: replay_setup was not called");
        return NULL;
    }
    PyObject *state = args[0], *plan = args[1], *text = args[2];
    if (!PyTuple_Check(plan) || PyTuple_GET_SIZE(plan) != 9 || !PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "replay: a plan of 9 items and a str");
        return NULL;
    }
    Py_ssize_t lineno = PyLong_AsSsize_t(args[3]);
    if (lineno == -1 && PyErr_Occurred())
        return NULL;
    if (!PyUnicode_IS_ASCII(text))
        Py_RETURN_NONE;
    LineValues v = {0};
    Taken t = {0};
    PyObject *source = NULL, *summary = NULL, *out = NULL;
    if (call_limits() < 0)
        return NULL;
    int read = read_values(plan, text, (const char *)PyUnicode_DATA(text), PyUnicode_GET_LENGTH(text), &v);
    if (read <= 0) {
        out = read < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    int cont = may_continue(state, &v, lineno);
    if (cont != 0) {
        out = cont < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    int host_tag = PyObject_IsTrue(PyTuple_GET_ITEM(plan, 1)), slurm = PyObject_IsTrue(PyTuple_GET_ITEM(plan, 2)),
        torchrun = PyObject_IsTrue(PyTuple_GET_ITEM(plan, 3));
    if ((source = PyObject_GetAttr(state, N_source)) == NULL || (summary = PyObject_GetAttr(state, N_summary)) == NULL)
        goto done;
    if (take_prefix(state, source, summary, &v, host_tag, slurm, lineno, &t) < 0)
        goto done;
    if (torchrun && summary != Py_None && PyObject_SetAttr(summary, N_torchrun, Py_True) < 0)
        goto done;
    PyObject *sig = PyTuple_GET_ITEM(plan, 4);
    if (sig != Py_None && signature_event(state, source, sig, PyTuple_GET_ITEM(plan, 8), &v, &t, lineno) < 0)
        goto done;
    out = Py_NewRef(Py_True);
done:
    values_clear(&v);
    taken_clear(&t);
    Py_XDECREF(source);
    Py_XDECREF(summary);
    Py_CLEAR(R_memo);
    return out;
}
