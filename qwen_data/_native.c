/* The loops of qwen-data that must run at memory speed, in C.
 *
 * misspelled: the certificate's spelling check (`certify.spelling`). numpy's version gathers the table
 * once per token in several passes; this one reads one 16-byte entry per token (`Entry`: the token's
 * first 8 bytes, its length, whether it may stand here), so most tokens cost one cache line of the table
 * and one 8-byte comparison. A non-ASCII text's UTF-8 is the one CPython keeps on the str where the
 * encoder asked for it (gigatoken does), else made here.
 *
 * misspelled(ids, counts, texts, entries, flat, first) -> int
 *   ids      int32, every text's ids back to back (counts[k] of them for texts[k])
 *   counts   int64, one per text
 *   texts    list of str: what each text's ids must spell, as UTF-8
 *   entries  uint8, 16 bytes an id of the table (`Entry`; `certify.spelling.Spelling.entries` makes them)
 *   flat     uint8, every id's bytes back to back (a token longer than 8 bytes is read from here)
 *   first    the text to start from
 * Returns the index of the first text from `first` whose ids do not spell it (or hold an id not
 * allowed or outside the table), or -1 where all do.
 *
 * nfc_suspects: the texts that may not be in NFC (`text.nfc`), a bit test a character.
 *
 * structure_mask: the loss mask an SFT sample's ChatML structure gives (`certify.spelling`), read from
 * its ids through the same table in one pass, where numpy's version took three times the spelling
 * check's time (byte offsets by cumsum, the samples' bytes joined, a Python loop over turns).
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

/* LOW_BYTES[n]: the low n bytes of a little-endian word */
static const uint64_t LOW_BYTES[9] = {0, 0xffULL, 0xffffULL, 0xffffffULL, 0xffffffffULL, 0xffffffffffULL,
                                      0xffffffffffffULL, 0xffffffffffffffULL, 0xffffffffffffffffULL};

/* One character as UTF-8 at `o`; → past it, or NULL for a lone surrogate. */
static inline uint8_t *put_utf8(uint8_t *o, Py_UCS4 u) {
    if (u < 0x80) {
        *o++ = (uint8_t)u;
    } else if (u < 0x800) {
        *o++ = (uint8_t)(0xC0 | (u >> 6));
        *o++ = (uint8_t)(0x80 | (u & 0x3F));
    } else if (u < 0x10000) {
        if (u >= 0xD800 && u <= 0xDFFF) return NULL;
        *o++ = (uint8_t)(0xE0 | (u >> 12));
        *o++ = (uint8_t)(0x80 | ((u >> 6) & 0x3F));
        *o++ = (uint8_t)(0x80 | (u & 0x3F));
    } else {
        *o++ = (uint8_t)(0xF0 | (u >> 18));
        *o++ = (uint8_t)(0x80 | ((u >> 12) & 0x3F));
        *o++ = (uint8_t)(0x80 | ((u >> 6) & 0x3F));
        *o++ = (uint8_t)(0x80 | (u & 0x3F));
    }
    return o;
}

/* `text`'s UTF-8 in `*buf` (grown to hold it, 8 bytes spare): its length; -1 where it holds a lone
 * surrogate, -2 out of memory. ASCII runs go 8 (or 4) characters at a time: ~0.5 ns a character,
 * where PyUnicode_AsUTF8AndSize took ~2.5 and kept its copy on every str. */
static Py_ssize_t utf8_of(PyObject *text, uint8_t **buf, Py_ssize_t *cap) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t need = n * (kind == PyUnicode_1BYTE_KIND ? 2 : kind == PyUnicode_2BYTE_KIND ? 3 : 4) + 8;
    if (need > *cap) {
        uint8_t *grown = PyMem_Realloc(*buf, (size_t)need);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -2;
        }
        *buf = grown;
        *cap = need;
    }
    uint8_t *o = *buf;
    Py_ssize_t i = 0;
    uint64_t w;
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *c = data;
        while (i < n) {
            if (n - i >= 8 && (memcpy(&w, c + i, 8), !(w & 0x8080808080808080ULL))) {
                memcpy(o, &w, 8);
                o += 8, i += 8;
            } else {
                o = put_utf8(o, c[i++]);
            }
        }
    } else if (kind == PyUnicode_2BYTE_KIND) {
        const Py_UCS2 *c = data;
        while (i < n) {
            if (n - i >= 4 && (memcpy(&w, c + i, 8), !(w & 0xFF80FF80FF80FF80ULL))) {
                o[0] = (uint8_t)c[i], o[1] = (uint8_t)c[i + 1], o[2] = (uint8_t)c[i + 2], o[3] = (uint8_t)c[i + 3];
                o += 4, i += 4;
            } else if ((o = put_utf8(o, c[i++])) == NULL) {
                return -1;
            }
        }
    } else {
        const Py_UCS4 *c = data;
        while (i < n)
            if ((o = put_utf8(o, c[i++])) == NULL) return -1;
    }
    return o - *buf;
}

/* One id of the table, as `Spelling.entries` lays it out: a token's check reads one cache line. */
typedef struct {
    uint64_t head;    /* the token's first 8 bytes (zeros past its end) */
    uint32_t offset;  /* where its bytes start in flat */
    uint16_t length;  /* its bytes */
    uint8_t allowed;  /* 0: the id may not stand in a text (a control id the policy keeps as text) */
    uint8_t unused;
} Entry;

/* Whether `n` (> 8) bytes at `a` and `b` are equal: 8 at a time, the last 8 overlapping, inline (memcmp
 * was a call for each of the ~5% of tokens longer than 8 bytes). */
static inline int same_bytes(const uint8_t *a, const uint8_t *b, Py_ssize_t n) {
    uint64_t x, y;
    for (Py_ssize_t i = 0; i + 8 < n; i += 8) {
        memcpy(&x, a + i, 8), memcpy(&y, b + i, 8);
        if (x != y) return 0;
    }
    memcpy(&x, a + n - 8, 8), memcpy(&y, b + n - 8, 8);
    return x == y;
}

/* Tokens ahead whose table entry is fetched early: a worker's encoding evicts the table between checks,
 * and a miss waited for token by token cost more than the comparisons. */
#define PREFETCH 16

static PyObject *misspelled(PyObject *self, PyObject *args) {
    PyObject *ids_obj, *counts_obj, *texts, *entries_obj, *flat_obj;
    Py_ssize_t first;
    if (!PyArg_ParseTuple(args, "OOO!OOn", &ids_obj, &counts_obj, &PyList_Type, &texts, &entries_obj, &flat_obj,
                          &first))
        return NULL;
    Py_buffer ids_b, counts_b, entries_b, flat_b;
    uint8_t *own = NULL;  /* a non-ASCII text's UTF-8, made here: CPython's would stay on the str */
    if (view(ids_obj, &ids_b, 4, "ids") < 0) return NULL;
    if (view(counts_obj, &counts_b, 8, "counts") < 0) goto ids;
    if (view(entries_obj, &entries_b, 1, "entries") < 0) goto counts;
    if (view(flat_obj, &flat_b, 1, "flat") < 0) goto entries;

    const int32_t *ids = ids_b.buf;
    const int64_t *counts = counts_b.buf;
    const Entry *table = entries_b.buf;
    const uint8_t *flat = flat_b.buf;
    Py_ssize_t n_ids = ids_b.len / 4, n_texts = PyList_GET_SIZE(texts), flat_len = flat_b.len;
    int64_t n_table = entries_b.len / (Py_ssize_t)sizeof(Entry);
    if (counts_b.len / 8 != n_texts) {
        PyErr_SetString(PyExc_ValueError, "counts and texts differ in length");
        goto fail;
    }
    Py_ssize_t at = 0, result = -1, cap = 0;
    for (Py_ssize_t k = 0; k < first && k < n_texts; k++) at += counts[k];
    for (Py_ssize_t k = first; k < n_texts; k++) {
        PyObject *text = PyList_GET_ITEM(texts, k);
        if (!PyUnicode_Check(text)) {
            PyErr_SetString(PyExc_TypeError, "texts must be str");
            goto fail;
        }
        const uint8_t *bytes;
        Py_ssize_t size;
        if (PyUnicode_IS_ASCII(text)) {
            bytes = PyUnicode_DATA(text);
            size = PyUnicode_GET_LENGTH(text);
        } else if (PyUnicode_IS_COMPACT(text) && ((PyCompactUnicodeObject *)text)->utf8 != NULL) {
            /* the UTF-8 the encoder asked CPython for (it stays on the str): read, never made again */
            bytes = (const uint8_t *)((PyCompactUnicodeObject *)text)->utf8;
            size = ((PyCompactUnicodeObject *)text)->utf8_length;
        } else {
            size = utf8_of(text, &own, &cap);
            if (size == -2) goto fail;  /* no memory */
            if (size < 0) {  /* a lone surrogate: the caller's slower check says why */
                result = k;
                break;
            }
            bytes = own;
        }
        Py_ssize_t end = at + counts[k], pos = 0;
        if (counts[k] < 0 || end > n_ids) {
            PyErr_SetString(PyExc_ValueError, "counts add up to more ids than given");
            goto fail;
        }
        for (; at < end; at++) {
            int32_t id = ids[at];
            if (id < 0 || id >= n_table) break;
            if (at + PREFETCH < n_ids) {  /* the entry a later token reads, fetched while this one is compared */
                uint32_t ahead = (uint32_t)ids[at + PREFETCH];
                if (ahead < (uint64_t)n_table) __builtin_prefetch(table + ahead);
            }
            const Entry *e = table + id;
            Py_ssize_t length = e->length;
            if (!e->allowed || length > size - pos) break;
            if (length <= 8) {
                /* most tokens: one 8-byte comparison, the bytes past the token masked off */
                uint64_t y = 0;
                if (pos + 8 <= size)
                    memcpy(&y, bytes + pos, 8);  /* a constant size: one load, where a size known only here was a call */
                else
                    memcpy(&y, bytes + pos, (size_t)(size - pos));
                if ((e->head ^ y) & LOW_BYTES[length]) break;
            } else if ((Py_ssize_t)e->offset + length > flat_len ||  /* never read past the table */
                       !same_bytes(flat + e->offset, bytes + pos, length)) {
                break;
            }
            pos += length;
        }
        if (at < end || pos != size) {
            result = k;
            break;
        }
    }
    PyMem_Free(own);
    PyBuffer_Release(&flat_b);
    PyBuffer_Release(&entries_b);
    PyBuffer_Release(&counts_b);
    PyBuffer_Release(&ids_b);
    return PyLong_FromSsize_t(result);
fail:
    PyMem_Free(own);
    PyBuffer_Release(&flat_b);
entries:
    PyBuffer_Release(&entries_b);
counts:
    PyBuffer_Release(&counts_b);
ids:
    PyBuffer_Release(&ids_b);
    return NULL;
}

/* poly(data, h1, h2) -> (h1, h2): the .bin's joinable content hash (`formats.digest`). The bytes
 * b_0 .. b_{n-1} are the coefficients of a polynomial, evaluated at two fixed points X[k] modulo the
 * prime 2^61 - 1 (Horner's rule): (h1, h2) go on from the hash of the bytes before `data`, as
 * h * X^len(data) + H(data). Eight bytes at a time: each byte's term b * X^(7-j) from a table, then
 * one multiplication of the running hash by X^8. The GIL is let go: threads hash ranges of a file at
 * once. */
#define P61 ((((uint64_t)1) << 61) - 1)
/* The points: the first 16 hex digits of sha256(b"qwen-data .bin hash, point k") for k = 1, 2,
 * reduced mod 2^61 - 1 (`formats.digest.POINTS` states them too, and a test holds the two equal). */
static const uint64_t X[2] = {0x137155d0bc81f45fULL, 0x10b4ac43ee7b7cc9ULL};
static uint64_t TERMS[2][8][256], X8[2], X16[2];  /* made as the module loads */

static inline uint64_t reduce61(uint64_t v) {
    v = (v & P61) + (v >> 61);
    return v >= P61 ? v - P61 : v;
}

static inline uint64_t mul61(uint64_t a, uint64_t b) {
    __uint128_t z = (__uint128_t)a * b;
    return reduce61(((uint64_t)z & P61) + (uint64_t)(z >> 61));
}

static void make_terms(void) {
    for (int k = 0; k < 2; k++) {
        uint64_t power = 1;  /* X^(7-j), j from 7 down */
        for (int j = 7; j >= 0; j--) {
            for (int b = 0; b < 256; b++) TERMS[k][j][b] = mul61((uint64_t)b, power);
            power = mul61(power, X[k]);
        }
        X8[k] = power;
        X16[k] = mul61(power, power);
    }
}

static PyObject *poly(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned long long h1, h2;
    if (!PyArg_ParseTuple(args, "y*KK", &data, &h1, &h2)) return NULL;
    if (h1 >= P61 || h2 >= P61) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "a hash is below 2^61 - 1");
        return NULL;
    }
    const uint8_t *b = data.buf;
    Py_ssize_t n = data.len, i = 0;
    uint64_t a1 = h1, a2 = h2;
    Py_BEGIN_ALLOW_THREADS
    /* sixteen bytes a turn: the running hash waits on one multiplication per 16 bytes, the first
     * eight's sum is moved by X^8 beside it */
    for (; i + 16 <= n; i += 16) {
        const uint8_t *w = b + i, *v = b + i + 8;
        uint64_t s[2][2];
        for (int k = 0; k < 2; k++) {
            const uint64_t (*t)[256] = TERMS[k];
            s[k][0] = reduce61(t[0][w[0]] + t[1][w[1]] + t[2][w[2]] + t[3][w[3]] + t[4][w[4]] + t[5][w[5]] +
                               t[6][w[6]] + t[7][w[7]]);  /* (eight terms below 2^61 each: the sum fits) */
            s[k][1] = reduce61(t[0][v[0]] + t[1][v[1]] + t[2][v[2]] + t[3][v[3]] + t[4][v[4]] + t[5][v[5]] +
                               t[6][v[6]] + t[7][v[7]]);
        }
        a1 = reduce61(mul61(a1, X16[0]) + reduce61(mul61(s[0][0], X8[0]) + s[0][1]));
        a2 = reduce61(mul61(a2, X16[1]) + reduce61(mul61(s[1][0], X8[1]) + s[1][1]));
    }
    for (; i + 8 <= n; i += 8) {
        const uint8_t *w = b + i;
        uint64_t s1 = TERMS[0][0][w[0]] + TERMS[0][1][w[1]] + TERMS[0][2][w[2]] + TERMS[0][3][w[3]] +
                      TERMS[0][4][w[4]] + TERMS[0][5][w[5]] + TERMS[0][6][w[6]] + TERMS[0][7][w[7]];
        uint64_t s2 = TERMS[1][0][w[0]] + TERMS[1][1][w[1]] + TERMS[1][2][w[2]] + TERMS[1][3][w[3]] +
                      TERMS[1][4][w[4]] + TERMS[1][5][w[5]] + TERMS[1][6][w[6]] + TERMS[1][7][w[7]];
        a1 = reduce61(mul61(a1, X8[0]) + reduce61(s1));
        a2 = reduce61(mul61(a2, X8[1]) + reduce61(s2));
    }
    for (; i < n; i++) {
        a1 = reduce61(mul61(a1, X[0]) + b[i]);
        a2 = reduce61(mul61(a2, X[1]) + b[i]);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return Py_BuildValue("KK", (unsigned long long)a1, (unsigned long long)a2);
}

/* structure_mask(ids, sample_ends, starts, flat, im_start, im_end, span, last_only, empty_think)
 *     -> bytes, one 0/1 per id
 *   sample_ends  int64: each sample's end in ids (samples lie back to back)
 *   im_start, im_end  the control ids; span: 0 im_end_nl, 1 im_end, 2 trl, 3 turn
 * In a sample, each im_start token whose bytes and the next ones' spell HEADER opens a turn that the
 * sample's next im_end token closes; the turn's trained bytes are cut as `span` says (from the
 * content, or the newline before it under trl, or the turn's first byte; to the end of <|im_end|>,
 * or the newline after it where there is one); `last_only`: the sample's last turn only;
 * `empty_think`: an empty think block opening the content is left out. A token is trained when any
 * of its bytes is. The bytes are the concatenation of every id's spelling, samples included (a
 * newline after <|im_end|> is looked for there even across a sample's end, as numpy's did). */
static const char HEADER[] = "<|im_start|>assistant\n", EMPTY_THINK[] = "<think>\n\n</think>\n\n";

typedef struct {
    const int32_t *ids;
    const int64_t *pos;  /* pos[t]: token t's first byte; pos[n]: the end */
    const int64_t *table;
    const uint8_t *flat;
    Py_ssize_t n;
} Stream;

/* Whether the bytes from `offset` (within token `tok` or after it) are `pattern`. */
static int spells_at(const Stream *s, Py_ssize_t tok, int64_t offset, const char *pattern, size_t length) {
    for (size_t k = 0; k < length; k++, offset++) {
        while (tok < s->n && s->pos[tok + 1] <= offset) tok++;
        if (tok >= s->n) return 0;
        if (s->flat[s->table[s->ids[tok]] + (offset - s->pos[tok])] != (uint8_t)pattern[k]) return 0;
    }
    return 1;
}

/* Marks the tokens touching bytes [a, b): from the first ending after a to the last starting before b. */
static void mark(const Stream *s, uint8_t *mask, int64_t a, int64_t b) {
    if (b <= a) return;
    Py_ssize_t lo = 0, hi = s->n;
    while (lo < hi) {  /* the first token whose end is past a */
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (s->pos[mid + 1] > a) hi = mid; else lo = mid + 1;
    }
    for (Py_ssize_t t = lo; t < s->n && s->pos[t] < b; t++) mask[t] = 1;
}

static PyObject *structure_mask(PyObject *self, PyObject *args) {
    PyObject *ids_obj, *ends_obj, *starts_obj, *flat_obj;
    int im_start, im_end, span, last_only, empty_think;
    if (!PyArg_ParseTuple(args, "OOOOiiipp", &ids_obj, &ends_obj, &starts_obj, &flat_obj, &im_start, &im_end,
                          &span, &last_only, &empty_think))
        return NULL;
    if (span < 0 || span > 3) {
        PyErr_SetString(PyExc_ValueError, "span: 0 to 3");
        return NULL;
    }
    Py_buffer ids_b, ends_b, starts_b, flat_b;
    if (view(ids_obj, &ids_b, 4, "ids") < 0) return NULL;
    if (view(ends_obj, &ends_b, 8, "sample_ends") < 0) goto ids;
    if (view(starts_obj, &starts_b, 8, "starts") < 0) goto ends;
    if (view(flat_obj, &flat_b, 1, "flat") < 0) goto starts;

    Stream s = {ids_b.buf, NULL, starts_b.buf, flat_b.buf, ids_b.len / 4};
    const int64_t *sample_ends = ends_b.buf;
    Py_ssize_t n_samples = ends_b.len / 8;
    int64_t n_table = starts_b.len / 8 - 1;
    PyObject *out = PyBytes_FromStringAndSize(NULL, s.n);
    int64_t *pos = PyMem_Malloc((size_t)(s.n + 1) * sizeof(int64_t));
    if (out == NULL || pos == NULL) {
        Py_XDECREF(out);
        PyMem_Free(pos);
        PyErr_NoMemory();
        goto flat;
    }
    uint8_t *mask = (uint8_t *)PyBytes_AS_STRING(out);
    memset(mask, 0, (size_t)s.n);
    pos[0] = 0;
    for (Py_ssize_t t = 0; t < s.n; t++) {
        int32_t id = s.ids[t];
        if (id < 0 || id >= n_table) {  /* the spelling check refuses these first */
            Py_DECREF(out);
            PyMem_Free(pos);
            PyErr_Format(PyExc_ValueError, "id %d outside the table", (int)id);
            goto flat;
        }
        pos[t + 1] = pos[t] + (s.table[id + 1] - s.table[id]);
    }
    s.pos = pos;
    Py_ssize_t begin = 0, closing = -1;  /* the last im_end found, and the head it was found for */
    for (Py_ssize_t k = 0; k < n_samples; k++) {
        Py_ssize_t end = sample_ends[k] < s.n ? (Py_ssize_t)sample_ends[k] : s.n;
        int64_t last[4] = {0, 0, 0, 0};  /* the sample's last turn's pieces, under last_only */
        int turns = 0;
        for (Py_ssize_t h = begin; h < end; h++) {
            if (s.ids[h] != im_start || !spells_at(&s, h, pos[h], HEADER, sizeof HEADER - 1)) continue;
            if (closing <= h)
                for (closing = h + 1; closing < s.n && s.ids[closing] != im_end; closing++) {}
            if (closing >= end) continue;  /* no im_end in the sample after it */
            int64_t start = pos[h], content = start + (int64_t)(sizeof HEADER - 1), close = pos[closing + 1];
            int64_t stop = close + spells_at(&s, closing, close, "\n", 1);
            int64_t first = span == 2 ? content - 1 : span == 3 ? start : content;
            int64_t piece[4] = {first, span == 1 ? close : stop, 0, 0};
            if (empty_think && spells_at(&s, h, content, EMPTY_THINK, sizeof EMPTY_THINK - 1)) {
                piece[2] = content + (int64_t)(sizeof EMPTY_THINK - 1);
                piece[3] = piece[1];
                piece[1] = content;
            }
            if (last_only) {
                memcpy(last, piece, sizeof piece);
                turns++;
            } else {
                mark(&s, mask, piece[0], piece[1]);
                mark(&s, mask, piece[2], piece[3]);
            }
        }
        if (last_only && turns) {
            mark(&s, mask, last[0], last[1]);
            mark(&s, mask, last[2], last[3]);
        }
        begin = end;
    }
    PyMem_Free(pos);
    PyBuffer_Release(&flat_b);
    PyBuffer_Release(&starts_b);
    PyBuffer_Release(&ends_b);
    PyBuffer_Release(&ids_b);
    return out;
flat:
    PyBuffer_Release(&flat_b);
starts:
    PyBuffer_Release(&starts_b);
ends:
    PyBuffer_Release(&ends_b);
ids:
    PyBuffer_Release(&ids_b);
    return NULL;
}

/* nfc_suspects(texts, stable) -> list of int: the texts that may not be in NFC, by index: those holding a
 * code point whose bit in `stable` (uint8, a bit a code point, U+0000 to U+10FFFF, LSB first) is 0. A text
 * of stable code points only is its own NFC (`text.nfc`); ASCII and Latin-1 texts are (every code point
 * below U+0300 is stable). Python's quick check took ~1.2 ns a character; this takes a bit test. */
static PyObject *nfc_suspects(PyObject *self, PyObject *args) {
    PyObject *texts, *stable_obj;
    if (!PyArg_ParseTuple(args, "O!O", &PyList_Type, &texts, &stable_obj)) return NULL;
    Py_buffer stable_b;
    if (view(stable_obj, &stable_b, 1, "stable") < 0) return NULL;
    if (stable_b.len * 8 < 0x110000) {
        PyBuffer_Release(&stable_b);
        PyErr_SetString(PyExc_ValueError, "stable: a bit for every code point expected");
        return NULL;
    }
    const uint8_t *stable = stable_b.buf;
    PyObject *out = PyList_New(0);
    for (Py_ssize_t k = 0; out != NULL && k < PyList_GET_SIZE(texts); k++) {
        PyObject *text = PyList_GET_ITEM(texts, k);
        if (!PyUnicode_Check(text)) {
            PyErr_SetString(PyExc_TypeError, "texts must be str");
            Py_CLEAR(out);
            break;
        }
        int kind = PyUnicode_KIND(text), suspect = 0;
        if (kind == PyUnicode_1BYTE_KIND) continue;  /* ASCII or Latin-1 */
        const void *data = PyUnicode_DATA(text);
        Py_ssize_t n = PyUnicode_GET_LENGTH(text);
        if (kind == PyUnicode_2BYTE_KIND) {
            const Py_UCS2 *c = data;
            for (Py_ssize_t i = 0; i < n && !suspect; i++)
                suspect = c[i] >= 0x300 && !(stable[c[i] >> 3] >> (c[i] & 7) & 1);
        } else {
            const Py_UCS4 *c = data;
            for (Py_ssize_t i = 0; i < n && !suspect; i++)
                suspect = c[i] >= 0x300 && (c[i] > 0x10FFFF || !(stable[c[i] >> 3] >> (c[i] & 7) & 1));
        }
        if (suspect) {
            PyObject *index = PyLong_FromSsize_t(k);
            if (index == NULL || PyList_Append(out, index) < 0) Py_CLEAR(out);
            Py_XDECREF(index);
        }
    }
    PyBuffer_Release(&stable_b);
    return out;
}

static PyMethodDef methods[] = {
    {"misspelled", misspelled, METH_VARARGS, "The first text whose ids do not spell it, or -1."},
    {"structure_mask", structure_mask, METH_VARARGS, "The loss mask the samples' ChatML structure gives."},
    {"poly", poly, METH_VARARGS, "The .bin hash (h1, h2) going on over data."},
    {"nfc_suspects", nfc_suspects, METH_VARARGS, "The texts that may not be in NFC, by index."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    make_terms();
    return PyModule_Create(&module);
}
