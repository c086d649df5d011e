/* hvdtrain_native: the hot loops of writing tf.train.Example records as TFRecords, compiled.
 *
 * hvdtrain/data/tfrecord.py lays out a batch of Example records as pieces (a constant run of bytes, or a
 * ragged column: its bytes and each row's length) and calls two functions here:
 *
 *   varints(values, cols) -> (data, row_lengths)
 *       the protobuf varints of an int64 matrix (rows x cols, C order), row by row: their bytes, and each
 *       row's byte length (native int64s). Negative values encode as their 64-bit two's complement.
 *   assemble(pieces, n, framed) -> bytes
 *       row i of every piece, in order, for each of the n rows; with framed=True each row is framed as a
 *       TFRecord (8-byte little-endian length, masked CRC32C of it, data, masked CRC32C of the data).
 *
 * The Python module keeps a NumPy encoder that gives the same bytes (the reference the tests hold this one
 * to, and the path when this module is not installed). The loops run without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* -- CRC32C (Castagnoli), slice-by-8, and the SSE4.2 instruction where the CPU has it -------------------- */

static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc32c_sw(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^ crc_table[5][(lo >> 16) & 0xFF] ^
            crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]] ^
            crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--) c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xFF];
    return ~c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_HW_CRC 1
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(const uint8_t *p, size_t n) {
    uint64_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return ~c32;
}
#endif

static int use_hw_crc = 0;

static uint32_t masked_crc_of(const uint8_t *p, size_t n, int hardware) {
#ifdef HAVE_HW_CRC
    uint32_t c = hardware ? crc32c_hw(p, n) : crc32c_sw(p, n);
#else
    (void)hardware;
    uint32_t c = crc32c_sw(p, n);
#endif
    return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

static uint32_t masked_crc(const uint8_t *p, size_t n) {
    return masked_crc_of(p, n, use_hw_crc);
}

static void put_le32(uint8_t *p, uint32_t v) {
    for (int k = 0; k < 4; k++) p[k] = (uint8_t)(v >> (8 * k));
}

static void put_le64(uint8_t *p, uint64_t v) {
    for (int k = 0; k < 8; k++) p[k] = (uint8_t)(v >> (8 * k));
}

/* -- varints ------------------------------------------------------------------------------------------ */

static inline Py_ssize_t varint_size(uint64_t v) {
    return v ? 1 + (63 - __builtin_clzll(v)) / 7 : 1;
}

static PyObject *varints(PyObject *self, PyObject *args) {
    Py_buffer values;
    Py_ssize_t cols;
    if (!PyArg_ParseTuple(args, "y*n", &values, &cols)) return NULL;
    PyObject *data = NULL, *lengths = NULL;
    if (values.len % 8 != 0 || cols < 0 || (cols == 0 && values.len != 0) ||
        (cols > 0 && (values.len / 8) % cols != 0)) {
        PyErr_Format(PyExc_ValueError, "varints: %zd bytes are not rows of %zd int64 values", values.len, cols);
        goto done;
    }
    Py_ssize_t count = values.len / 8, rows = cols ? count / cols : 0;
    const uint8_t *src = (const uint8_t *)values.buf;
    lengths = PyBytes_FromStringAndSize(NULL, rows * (Py_ssize_t)sizeof(int64_t));
    if (lengths == NULL) goto done;
    int64_t *row_len = (int64_t *)PyBytes_AS_STRING(lengths);
    Py_ssize_t total = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        Py_ssize_t len = 0;
        for (Py_ssize_t c = 0; c < cols; c++) {
            uint64_t v;
            memcpy(&v, src + 8 * (r * cols + c), 8);
            len += varint_size(v);
        }
        row_len[r] = len;
        total += len;
    }
    data = PyBytes_FromStringAndSize(NULL, total);
    if (data == NULL) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(data);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t v;
        memcpy(&v, src + 8 * i, 8);
        while (v >= 0x80) {
            *out++ = (uint8_t)(v | 0x80);
            v >>= 7;
        }
        *out++ = (uint8_t)v;
    }
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&values);
    if (data == NULL || lengths == NULL) {
        Py_XDECREF(data);
        Py_XDECREF(lengths);
        return NULL;
    }
    return Py_BuildValue("(NN)", data, lengths);
}

/* -- assembling records ------------------------------------------------------------------------------- */

typedef struct {
    Py_buffer data;     /* a constant's bytes, or a ragged column's bytes */
    Py_buffer lengths;  /* a ragged column's row lengths (n int64); obj NULL for a constant */
    const uint8_t *cursor;
} Piece;

static void release(Piece *pieces, Py_ssize_t count) {
    for (Py_ssize_t i = 0; i < count; i++) {
        PyBuffer_Release(&pieces[i].data);
        if (pieces[i].lengths.obj != NULL) PyBuffer_Release(&pieces[i].lengths);
    }
    PyMem_Free(pieces);
}

static PyObject *assemble(PyObject *self, PyObject *args) {
    PyObject *seq_in;
    Py_ssize_t n;
    int framed;
    if (!PyArg_ParseTuple(args, "Onp", &seq_in, &n, &framed)) return NULL;
    if (n < 0) return PyErr_Format(PyExc_ValueError, "assemble: %zd rows", n);
    PyObject *seq = PySequence_Fast(seq_in, "assemble: pieces must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq), ready = 0;
    Piece *pieces = PyMem_Calloc(count ? count : 1, sizeof(Piece));
    PyObject *result = NULL;
    if (pieces == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    Py_ssize_t total = framed ? 16 * n : 0;
    for (Py_ssize_t i = 0; i < count; i++, ready++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        Piece *p = &pieces[i];
        if (PyTuple_Check(item)) {
            if (PyTuple_GET_SIZE(item) != 2) {
                PyErr_Format(PyExc_ValueError, "assemble: piece %zd is not (data, lengths)", i);
                goto fail;
            }
            if (PyObject_GetBuffer(PyTuple_GET_ITEM(item, 0), &p->data, PyBUF_SIMPLE) < 0) goto fail;
            if (PyObject_GetBuffer(PyTuple_GET_ITEM(item, 1), &p->lengths, PyBUF_SIMPLE) < 0) {
                PyBuffer_Release(&p->data);
                goto fail;
            }
            if (p->lengths.len != n * (Py_ssize_t)sizeof(int64_t)) {
                PyErr_Format(PyExc_ValueError, "assemble: piece %zd has %zd bytes of lengths for %zd rows", i,
                             p->lengths.len, n);
                ready++;
                goto fail;
            }
            const int64_t *len = (const int64_t *)p->lengths.buf;
            Py_ssize_t sum = 0;
            for (Py_ssize_t r = 0; r < n; r++) {
                if (len[r] < 0) {
                    PyErr_Format(PyExc_ValueError, "assemble: piece %zd row %zd has length %lld", i, r,
                                 (long long)len[r]);
                    ready++;
                    goto fail;
                }
                sum += (Py_ssize_t)len[r];
            }
            if (sum != p->data.len) {
                PyErr_Format(PyExc_ValueError, "assemble: piece %zd's rows add up to %zd bytes, its data has %zd",
                             i, sum, p->data.len);
                ready++;
                goto fail;
            }
            total += sum;
        } else {
            if (PyObject_GetBuffer(item, &p->data, PyBUF_SIMPLE) < 0) goto fail;
            total += p->data.len * n;
        }
        p->cursor = (const uint8_t *)p->data.buf;
    }
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) goto fail;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < n; r++) {
        uint8_t *start = out;
        if (framed) out += 12;
        uint8_t *body = out;
        for (Py_ssize_t i = 0; i < count; i++) {
            Piece *p = &pieces[i];
            if (p->lengths.obj != NULL) {
                Py_ssize_t len = (Py_ssize_t)((const int64_t *)p->lengths.buf)[r];
                memcpy(out, p->cursor, len);
                p->cursor += len;
                out += len;
            } else {
                memcpy(out, p->data.buf, p->data.len);
                out += p->data.len;
            }
        }
        if (framed) {
            size_t len = (size_t)(out - body);
            put_le64(start, (uint64_t)len);
            put_le32(start + 8, masked_crc(start, 8));
            put_le32(out, masked_crc(body, len));
            out += 4;
        }
    }
    Py_END_ALLOW_THREADS
    release(pieces, count);
    Py_DECREF(seq);
    return result;
fail:
    if (pieces != NULL) release(pieces, ready);
    Py_DECREF(seq);
    return NULL;
}

static PyObject *masked_crc32c(PyObject *self, PyObject *args) {
    Py_buffer data;
    int software = 0;
    if (!PyArg_ParseTuple(args, "y*|p", &data, &software)) return NULL;
    uint32_t c = masked_crc_of((const uint8_t *)data.buf, (size_t)data.len, use_hw_crc && !software);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef methods[] = {
    {"varints", varints, METH_VARARGS, "varints(values, cols) -> (data, row_lengths): protobuf varints of an "
                                       "int64 matrix, row by row"},
    {"assemble", assemble, METH_VARARGS, "assemble(pieces, n, framed) -> bytes: n rows of pieces laid end to "
                                         "end, each framed as a TFRecord when framed"},
    {"masked_crc32c", masked_crc32c, METH_VARARGS, "masked_crc32c(data, software=False) -> int: TFRecord's masked CRC32C "
                                                   "(by the portable table loop when software)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "hvdtrain_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit_hvdtrain_native(void) {
    crc_init();
#ifdef HAVE_HW_CRC
    __builtin_cpu_init();
    use_hw_crc = __builtin_cpu_supports("sse4.2") != 0;
#endif
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "HARDWARE_CRC", use_hw_crc) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
