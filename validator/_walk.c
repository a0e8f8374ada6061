/* Compiled helpers of validator.schedule and validator.checker: the non-uniform schedule walk (the
 * compiled form of validator.schedule._walk_prefix) and the check of an integer list.
 *
 * The request stream: request i occupies [C[i], C[i+1]) with C the running sum of the widths
 * n_i + F. A partition starting at x ends at x + QF, QF = ceil(total / P) + F. With c the last
 * request boundary at or before that end: if c <= x or the end lies more than F past c, the
 * partition splits request r (an event) and the next one starts at end - F; otherwise the next one
 * starts at c. Boundaries only move forward, so one forward scan over the widths finds each c:
 * O(b + P) in all.
 *
 * walk(lengths, block, P, F) -> (starts, events, total)
 *   lengths: C-contiguous int64 buffer of the b >= 1 effective lengths; request i's width is
 *   n_i + F with n_i = max(ceil(lengths[i] / block), 1) blocks
 *   starts: where each active partition starts, events: the request of each split event, both
 *   as bytes of native int64 values (the caller unpacks them when it needs them); total: the
 *   stream's length.
 *
 * rows(lengths, block, P, F, metadata, num_splits) -> None
 *   the scheduler's output itself, by the kernel's own greedy loop (one pass, O(b + P)): fills
 *   metadata (int32, at least P x 8 values, row-major; column 7 is 0) and num_splits (int32, at
 *   least b + 1 values).
 *
 * int_column(values, lo, hi, out) -> -1, or the index of the first value that is not a plain int
 * in [lo, hi]: copies a list of Python ints into the int64 buffer out (at least len(values) long).
 * Anything but an exact int (a bool, a float, a numpy scalar) counts as bad: the caller then takes
 * its general path, which names the problem.
 *
 * int_stats(values, lo, hi) -> (largest, sum), or None when values is empty or holds anything but
 * plain ints in [lo, hi] (0 <= lo; the sum must fit in int64): the range check of a list of Python
 * ints in one pass, without copying it (the verdict's check of a step's lists).
 *
 * dict_columns(entries, keys) -> a tuple of lists, one per key (the values of that key, in order), or
 * None when an entry is not a plain dict with exactly these keys: the columns of a list of records
 * of one shape, in one pass.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

static int
log2_exact(long long block)
{
    /* log2(block) when block is a power of two (blocks are then counted with a shift), else -1 */
    if (block < 1 || (block & (block - 1)) != 0)
        return -1;
    int shift = 0;
    while ((1LL << shift) < block)
        shift++;
    return shift;
}

static int64_t
count_blocks(const int64_t *len, Py_ssize_t b, long long block, int64_t F, int64_t add, int64_t *out)
{
    /* out[i] = n_i + add with n_i = max(ceil(len[i] / block), 1) blocks; returns the stream's total
       sum(n_i + F), or -1 with a ValueError set when it would not fit comfortably in int64 */
    const int64_t limit = INT64_MAX / 4;
    const int shift = log2_exact(block);
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < b; i++) {
        int64_t s = len[i];
        if (s > limit - total) {
            PyErr_Format(PyExc_ValueError, "lengths[%zd]: the stream's total does not fit in int64", i);
            return -1;
        }
        int64_t n = s <= 1 ? 1 : (shift >= 0 ? ((s - 1) >> shift) + 1 : (s - 1) / block + 1);
        out[i] = n + add;
        total += n + F;
    }
    return total;
}

static int
get_int32_out(PyObject *obj, Py_buffer *view, Py_ssize_t need, const char *name)
{
    /* a writable, C-contiguous int32 buffer (any shape) of at least `need` values */
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        goto refuse;
    }
    const char *fmt = view->format ? view->format : "B";
    if (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@')
        fmt++;
    if (view->itemsize == 4 && strcmp(fmt, "i") == 0 && view->len / 4 >= need)
        return 0;
    PyBuffer_Release(view);
refuse:
    PyErr_Format(PyExc_TypeError, "%s: expected a writable, C-contiguous int32 buffer of at least %zd values",
                 name, need);
    return -1;
}

static int
get_int64_buffer(PyObject *obj, Py_buffer *view, int writable, const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    /* every refusal is a TypeError, so that callers can convert their input and try again */
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        PyErr_Clear();
        goto refuse;
    }
    const char *fmt = view->format ? view->format : "B";
    if (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@')
        fmt++;
    if (view->itemsize == 8 && (strcmp(fmt, "q") == 0 || strcmp(fmt, "l") == 0) && view->ndim == 1)
        return 0;
    PyBuffer_Release(view);
refuse:
    PyErr_Format(PyExc_TypeError, "%s: expected a one-dimensional, C-contiguous%s int64 buffer", name,
                 writable ? ", writable" : "");
    return -1;
}

static PyObject *
walk(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *l_obj;
    long long block, P, F;
    if (!PyArg_ParseTuple(args, "OLLL", &l_obj, &block, &P, &F))
        return NULL;
    if (block < 1 || P < 1 || P > (1 << 24) || F < 0 || F > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "expected block >= 1, 1 <= P <= 2^24 and 0 <= F < 2^31");
        return NULL;
    }
    Py_buffer lv;
    if (get_int64_buffer(l_obj, &lv, 0, "lengths") < 0)
        return NULL;
    PyObject *result = NULL;
    int64_t *starts = NULL;
    const int64_t *len = (const int64_t *)lv.buf;
    Py_ssize_t b = lv.shape[0];
    if (b < 1) {
        PyErr_SetString(PyExc_ValueError, "lengths: expected at least one request");
        goto done;
    }
    /* widths n_i + F first (and the total), then the walk over them */
    starts = PyMem_Malloc((2 * (size_t)P + (size_t)b) * sizeof(int64_t));
    if (starts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *events = starts + P, *w = starts + 2 * P;
    const int64_t total = count_blocks(len, b, block, F, F, w);
    if (total < 0)
        goto done;
    const int64_t QF = (total + P - 1) / P + F;
    int64_t x = 0;
    Py_ssize_t r = 0;               /* request whose boundary c = C[r] is the last one at or before the end */
    int64_t c = 0, next = w[0];     /* C[r] and C[r + 1] */
    Py_ssize_t m = 0, E = 0;
    for (long long p = 0; p < P; p++) {
        starts[m++] = x;
        int64_t end = x + QF;
        if (end >= total)
            break;
        while (next <= end) {       /* next <= end < total: r + 1 < b */
            r++;
            c = next;
            next += w[r];
        }
        if (c <= x || end - c > F) {
            x = end - F;
            events[E++] = (int64_t)r;
        } else {
            x = c;
        }
    }
    result = Py_BuildValue("y#y#L", (const char *)starts, m * (Py_ssize_t)sizeof(int64_t),
                           (const char *)events, E * (Py_ssize_t)sizeof(int64_t), (long long)total);
done:
    PyMem_Free(starts);
    PyBuffer_Release(&lv);
    return result;
}

static PyObject *
rows(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *l_obj, *md_obj, *ns_obj;
    long long block, P, F;
    if (!PyArg_ParseTuple(args, "OLLLOO", &l_obj, &block, &P, &F, &md_obj, &ns_obj))
        return NULL;
    if (block < 1 || P < 1 || P > (1 << 24) || F < 0 || F > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "expected block >= 1, 1 <= P <= 2^24 and 0 <= F < 2^31");
        return NULL;
    }
    Py_buffer lv, mv, nv;
    if (get_int64_buffer(l_obj, &lv, 0, "lengths") < 0)
        return NULL;
    Py_ssize_t b = lv.shape[0];
    if (get_int32_out(md_obj, &mv, 8 * (Py_ssize_t)P, "metadata") < 0) {
        PyBuffer_Release(&lv);
        return NULL;
    }
    if (get_int32_out(ns_obj, &nv, b + 1, "num_splits") < 0) {
        PyBuffer_Release(&lv);
        PyBuffer_Release(&mv);
        return NULL;
    }
    PyObject *result = NULL;
    int64_t *n = NULL;
    const int64_t *len = (const int64_t *)lv.buf;
    int32_t *md = (int32_t *)mv.buf, *ns = (int32_t *)nv.buf;
    if (b < 1) {
        PyErr_SetString(PyExc_ValueError, "lengths: expected at least one request");
        goto done;
    }
    n = PyMem_Malloc((size_t)b * sizeof(int64_t));
    if (n == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t total = count_blocks(len, b, block, F, 0, n);
    if (total < 0)
        goto done;
    /* the kernel's greedy loop, one request and one partition at a time: request r, its first
       block k not yet placed, and j, the pieces of r placed so far */
    const int64_t payload = (total + P - 1) / P + F;
    Py_ssize_t r = 0;
    int64_t k = 0, j = 0;
    ns[0] = 0;
    for (long long p = 0; p < P; p++) {
        int64_t budget = payload;
        int64_t begin_req = r, begin_block = k, begin_split = j, first = k != 0;
        if (r >= b)                 /* nothing left: the kernel reads one past its array (last block of request 0) */
            begin_block = n[0] - 1;
        while (r < b) {
            int64_t need = n[r] - k + F;
            if (budget >= need) {
                budget -= need;
                ns[r + 1] = (int32_t)(ns[r] + j + 1);
                r++;
                k = 0;
                j = 0;
            } else {
                if (budget - F > 0) {
                    k += budget - F;
                    j++;
                }
                break;
            }
        }
        int64_t end_req = k > 0 ? r : r - 1;
        int64_t whole = len[end_req] == 0 ? 0 : n[end_req];
        int64_t end_block = k > 0 ? k : whole;
        int64_t last = end_block != n[end_req] && len[end_req] != 0;
        if (begin_req == end_req)
            first = last = first | last;
        int32_t *row = md + 8 * p;
        row[0] = (int32_t)begin_req;
        row[1] = (int32_t)end_req;
        row[2] = (int32_t)begin_block;
        row[3] = (int32_t)end_block;
        row[4] = (int32_t)begin_split;
        row[5] = (int32_t)first;
        row[6] = (int32_t)last;
        row[7] = 0;
    }
    for (; r < b; r++) {            /* not reached when the partitions hold every request */
        ns[r + 1] = (int32_t)(ns[r] + j + 1);
        j = 0;
    }
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(n);
    PyBuffer_Release(&lv);
    PyBuffer_Release(&mv);
    PyBuffer_Release(&nv);
    return result;
}

static PyObject *
int_column(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *values, *o_obj;
    long long lo, hi;
    if (!PyArg_ParseTuple(args, "O!LLO", &PyList_Type, &values, &lo, &hi, &o_obj))
        return NULL;
    Py_buffer ov;
    if (get_int64_buffer(o_obj, &ov, 1, "out") < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(values), bad = -1;
    if (ov.shape[0] < n) {
        PyBuffer_Release(&ov);
        PyErr_SetString(PyExc_ValueError, "out: expected room for every value");
        return NULL;
    }
    int64_t *out = (int64_t *)ov.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(values, i);
        int overflow = 0;
        long long v;
        if (!PyLong_CheckExact(item) || ((v = PyLong_AsLongLongAndOverflow(item, &overflow)), overflow)
                || v < lo || v > hi) {
            bad = i;
            break;
        }
        out[i] = (int64_t)v;
    }
    PyBuffer_Release(&ov);
    return PyLong_FromSsize_t(bad);
}

static PyObject *
int_stats(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *values;
    long long lo, hi;
    if (!PyArg_ParseTuple(args, "O!LL", &PyList_Type, &values, &lo, &hi))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(values);
    if (n == 0 || lo < 0)
        Py_RETURN_NONE;
    long long best = -1, sum = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(values, i);
        int overflow = 0;
        long long v;
        if (!PyLong_CheckExact(item) || ((v = PyLong_AsLongLongAndOverflow(item, &overflow)), overflow)
                || v < lo || v > hi || sum > LLONG_MAX - v)
            Py_RETURN_NONE;
        if (v > best)
            best = v;
        sum += v;
    }
    return Py_BuildValue("(LL)", best, sum);
}

static PyObject *
dict_columns(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *entries, *keys;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &entries, &PyTuple_Type, &keys))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(entries), k = PyTuple_GET_SIZE(keys);
    PyObject *out = PyTuple_New(k);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j < k; j++) {
        PyObject *col = PyList_New(n);
        if (col == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, j, col);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyList_GET_ITEM(entries, i);
        if (!PyDict_CheckExact(d) || PyDict_GET_SIZE(d) != k)
            goto mismatch;
        for (Py_ssize_t j = 0; j < k; j++) {
            PyObject *v = PyDict_GetItemWithError(d, PyTuple_GET_ITEM(keys, j));
            if (v == NULL) {
                if (PyErr_Occurred()) {
                    Py_DECREF(out);
                    return NULL;
                }
                goto mismatch;
            }
            Py_INCREF(v);
            PyList_SET_ITEM(PyTuple_GET_ITEM(out, j), i, v);
        }
    }
    return out;
mismatch:
    Py_DECREF(out);     /* the lists' unset items are NULL, which their deallocation skips */
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS,
     "walk(lengths, block, P, F) -> (starts, events, total): the non-uniform schedule walk."},
    {"rows", rows, METH_VARARGS,
     "rows(lengths, block, P, F, metadata, num_splits): fills the [P, 8] int32 tile metadata and the [b + 1] int32 num_splits."},
    {"int_column", int_column, METH_VARARGS,
     "int_column(values, lo, hi, out) -> -1 or the index of the first value that is not an int in [lo, hi]."},
    {"int_stats", int_stats, METH_VARARGS,
     "int_stats(values, lo, hi) -> (largest, sum), or None unless every value is an int in [lo, hi] (lo >= 0)."},
    {"dict_columns", dict_columns, METH_VARARGS,
     "dict_columns(entries, keys) -> one list per key, or None unless every entry is a dict with exactly these keys."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_walk", "Compiled schedule walk (optional; validator.schedule falls back to Python).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__walk(void)
{
    return PyModule_Create(&module);
}
