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
 * walk(lengths, block, P, F, starts, events) -> (active partitions, split events, total)
 *   lengths: C-contiguous int64 buffer of the b >= 1 effective lengths; request i's width is
 *   n_i + F with n_i = max(ceil(lengths[i] / block), 1) blocks
 *   starts, events: writable C-contiguous int64 buffers of at least P values; the first
 *   `active` of starts and the first `events` of events are written.
 *
 * int_column(values, lo, hi, out) -> -1, or the index of the first value that is not a plain int
 * in [lo, hi]: copies a list of Python ints into the int64 buffer out (at least len(values) long).
 * Anything but an exact int (a bool, a float, a numpy scalar) counts as bad: the caller then takes
 * its general path, which names the problem.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static int
get_int64_buffer(PyObject *obj, Py_buffer *view, int writable, const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    const char *fmt = view->format ? view->format : "B";
    if (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@')
        fmt++;
    if (view->itemsize != 8 || (strcmp(fmt, "q") != 0 && strcmp(fmt, "l") != 0) || view->ndim != 1) {
        PyErr_Format(PyExc_TypeError, "%s: expected a one-dimensional int64 buffer", name);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *
walk(PyObject *self, PyObject *args)
{
    PyObject *l_obj, *s_obj, *e_obj;
    long long block, P, F;
    if (!PyArg_ParseTuple(args, "OLLLOO", &l_obj, &block, &P, &F, &s_obj, &e_obj))
        return NULL;
    if (block < 1 || P < 1 || F < 0 || F > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "expected block >= 1, P >= 1 and 0 <= F < 2^31");
        return NULL;
    }
    Py_buffer lv, sv, ev;
    if (get_int64_buffer(l_obj, &lv, 0, "lengths") < 0)
        return NULL;
    if (get_int64_buffer(s_obj, &sv, 1, "starts") < 0) {
        PyBuffer_Release(&lv);
        return NULL;
    }
    if (get_int64_buffer(e_obj, &ev, 1, "events") < 0) {
        PyBuffer_Release(&lv);
        PyBuffer_Release(&sv);
        return NULL;
    }
    PyObject *result = NULL;
    const int64_t *len = (const int64_t *)lv.buf;
    int64_t *starts = (int64_t *)sv.buf;
    int64_t *events = (int64_t *)ev.buf;
    Py_ssize_t b = lv.shape[0];
    if (b < 1 || sv.shape[0] < P || ev.shape[0] < P) {
        PyErr_SetString(PyExc_ValueError, "expected at least one width and P slots for starts and events");
        goto done;
    }
    /* the widths, computed twice (here for the total, below while scanning) rather than stored */
    const int64_t limit = INT64_MAX / 4;
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < b; i++) {
        int64_t s = len[i];
        if (s > limit - total) {
            PyErr_Format(PyExc_ValueError, "lengths[%zd]: the stream's total does not fit in int64", i);
            goto done;
        }
        total += (s > block ? (s + block - 1) / block : 1) + F;
    }
#define WIDTH(i) ((len[i] > block ? (len[i] + block - 1) / block : 1) + F)
    const int64_t QF = (total + P - 1) / P + F;
    int64_t x = 0;
    Py_ssize_t r = 0;               /* request whose boundary c = C[r] is the last one at or before the end */
    int64_t c = 0, next = WIDTH(0); /* C[r] and C[r + 1] */
    Py_ssize_t m = 0, E = 0;
    for (long long p = 0; p < P; p++) {
        starts[m++] = x;
        int64_t end = x + QF;
        if (end >= total)
            break;
        while (next <= end) {       /* next <= end < total: r + 1 < b */
            r++;
            c = next;
            next += WIDTH(r);
        }
        if (c <= x || end - c > F) {
            x = end - F;
            events[E++] = (int64_t)r;
        } else {
            x = c;
        }
    }
#undef WIDTH
    result = Py_BuildValue("nnL", m, E, (long long)total);
done:
    PyBuffer_Release(&lv);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&ev);
    return result;
}

static PyObject *
int_column(PyObject *self, PyObject *args)
{
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

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS,
     "walk(lengths, block, P, F, starts, events) -> (active, events, total): the non-uniform schedule walk."},
    {"int_column", int_column, METH_VARARGS,
     "int_column(values, lo, hi, out) -> -1 or the index of the first value that is not an int in [lo, hi]."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_walk", "Compiled schedule walk (optional; validator.schedule falls back to Python).",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__walk(void)
{
    return PyModule_Create(&module);
}
