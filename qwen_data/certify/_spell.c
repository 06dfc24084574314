/* The spelling check's loop (`certify.spelling`), in C: numpy's version gathers the table once per
 * token in several passes and costs about a quarter of the encoder's own time; this one reads each
 * token's bytes once, at memory speed, so checking every document costs about 2% of encoding it (numpy: 15-25%).
 *
 * misspelled(ids, counts, texts, starts, flat, allowed, first) -> int
 *   ids      int32, every text's ids back to back (counts[k] of them for texts[k])
 *   counts   int64, one per text
 *   texts    list of str: what each text's ids must spell, as UTF-8
 *   starts   int64, one more than the table's ids: id i spells flat[starts[i]:starts[i + 1]]
 *   allowed  uint8, one per id of the table: 0 where the id may not appear (a control id the
 *            special-token policy keeps as text)
 *   first    the text to start from
 * Returns the index of the first text from `first` whose ids do not spell it (or hold an id not
 * allowed or outside the table), or -1 where all do.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static int view(PyObject *obj, Py_buffer *buf, Py_ssize_t item, const char *name) {
    if (PyObject_GetBuffer(obj, buf, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    if (buf->itemsize != item) {
        PyErr_Format(PyExc_TypeError, "%s: items of %zd bytes expected", name, item);
        PyBuffer_Release(buf);
        return -1;
    }
    return 0;
}

static PyObject *misspelled(PyObject *self, PyObject *args) {
    PyObject *ids_obj, *counts_obj, *texts, *starts_obj, *flat_obj, *allowed_obj;
    Py_ssize_t first;
    if (!PyArg_ParseTuple(args, "OOO!OOOn", &ids_obj, &counts_obj, &PyList_Type, &texts, &starts_obj,
                          &flat_obj, &allowed_obj, &first))
        return NULL;
    Py_buffer ids_b, counts_b, starts_b, flat_b, allowed_b;
    if (view(ids_obj, &ids_b, 4, "ids") < 0) return NULL;
    if (view(counts_obj, &counts_b, 8, "counts") < 0) goto ids;
    if (view(starts_obj, &starts_b, 8, "starts") < 0) goto counts;
    if (view(flat_obj, &flat_b, 1, "flat") < 0) goto starts;
    if (view(allowed_obj, &allowed_b, 1, "allowed") < 0) goto flat;

    const int32_t *ids = ids_b.buf;
    const int64_t *counts = counts_b.buf, *table = starts_b.buf;
    const uint8_t *flat = flat_b.buf, *allowed = allowed_b.buf;
    Py_ssize_t n_ids = ids_b.len / 4, n_texts = PyList_GET_SIZE(texts);
    int64_t n_table = starts_b.len / 8 - 1;
    if (n_table > allowed_b.len) n_table = allowed_b.len;
    if (counts_b.len / 8 != n_texts) {
        PyErr_SetString(PyExc_ValueError, "counts and texts differ in length");
        goto fail;
    }
    Py_ssize_t at = 0, result = -1;
    for (Py_ssize_t k = 0; k < first && k < n_texts; k++) at += counts[k];
    for (Py_ssize_t k = first; k < n_texts; k++) {
        Py_ssize_t size;
        PyObject *text = PyList_GET_ITEM(texts, k);
        if (!PyUnicode_Check(text)) {
            PyErr_SetString(PyExc_TypeError, "texts must be str");
            goto fail;
        }
        const char *bytes = PyUnicode_AsUTF8AndSize(text, &size);
        if (bytes == NULL) {  /* not UTF-8 (a lone surrogate): the caller's slower check says why */
            PyErr_Clear();
            result = k;
            break;
        }
        Py_ssize_t end = at + counts[k], pos = 0;
        if (counts[k] < 0 || end > n_ids) {
            PyErr_SetString(PyExc_ValueError, "counts add up to more ids than given");
            goto fail;
        }
        for (; at < end; at++) {
            int32_t id = ids[at];
            if (id < 0 || id >= n_table || !allowed[id]) break;
            int64_t a = table[id], length = table[id + 1] - a;
            if (length > size - pos || memcmp(flat + a, bytes + pos, (size_t)length) != 0) break;
            pos += length;
        }
        if (at < end || pos != size) {
            result = k;
            break;
        }
    }
    PyBuffer_Release(&allowed_b);
    PyBuffer_Release(&flat_b);
    PyBuffer_Release(&starts_b);
    PyBuffer_Release(&counts_b);
    PyBuffer_Release(&ids_b);
    return PyLong_FromSsize_t(result);
fail:
    PyBuffer_Release(&allowed_b);
flat:
    PyBuffer_Release(&flat_b);
starts:
    PyBuffer_Release(&starts_b);
counts:
    PyBuffer_Release(&counts_b);
ids:
    PyBuffer_Release(&ids_b);
    return NULL;
}

static PyMethodDef methods[] = {
    {"misspelled", misspelled, METH_VARARGS, "The first text whose ids do not spell it, or -1."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_spell", NULL, -1, methods};

PyMODINIT_FUNC PyInit__spell(void) { return PyModule_Create(&module); }
