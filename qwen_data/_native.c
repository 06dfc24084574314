/* The loops of qwen-data that must run at memory speed, in C.
 *
 * misspelled: the certificate's spelling check (`certify.spelling`). numpy's version gathers the table
 * once per token in several passes; this one reads one 16-byte entry per token (`Entry`: the token's
 * first 8 bytes, where the rest lie, its length), writes the token's bytes out and compares them with
 * the text once it ends: most tokens cost one cache line of the table and ~20 instructions. A
 * non-ASCII text's UTF-8 is the one CPython keeps on the str where the encoder asked for it
 * (gigatoken does), else made here.
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
 * nfc_suspects: the texts that may not be in NFC (`text.nfc`), a bit test a character; nfc_unsettled,
 * of those, the ones a check of classes and composing pairs cannot prove to be.
 *
 * structure_mask: the loss mask an SFT sample's ChatML structure gives (`certify.spelling`), read from
 * its ids through the same table in one pass, where numpy's version took three times the spelling
 * check's time (byte offsets by cumsum, the samples' bytes joined, a Python loop over turns).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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

/* One id of the table, as `Spelling.entries` lays it out: a token's check reads one cache line. An id
 * that may not stand in a text (a control id the policy keeps as text, one spelling nothing) has
 * length BARRED and offset past any table, so the check of a long token refuses it. */
typedef struct {
    uint64_t head;    /* the token's first 8 bytes (zeros past its end) */
    uint32_t offset;  /* where its bytes start in flat */
    uint16_t length;  /* its bytes */
    uint16_t unused;
} Entry;

/* The tokens written between two checks that the spelled bytes are still within the text: each short
 * one adds at most 8 bytes past it, so the buffer holds the text and SLACK more. */
#define BLOCK 16
#define SLACK (BLOCK * 8 + 16)

/* Tokens ahead whose table entry is fetched early: a worker's encoding evicts the table between checks,
 * and a miss waited for token by token cost more than the comparisons. 16 ahead (~40 ns) left most of a
 * miss to wait for: 48 took a fifth off the loop's samples in a pretraining worker (perf, 30 chunks). */
#define PREFETCH 48

/* Writes the bytes of the token `e` at `spelled + *pos` and moves `*pos` past them; 0 where it is
 * barred or would end past the text (`size`) or the table. */
static inline int spell_token(const Entry *e, const uint8_t *flat, Py_ssize_t flat_len, uint8_t *spelled,
                              Py_ssize_t *pos, Py_ssize_t size) {
    Py_ssize_t length = e->length;
    memcpy(spelled + *pos, &e->head, 8);
    if (length > 8) {
        if ((Py_ssize_t)e->offset + length > flat_len || length > size - *pos) return 0;
        memcpy(spelled + *pos, flat + e->offset, (size_t)length);
    }
    *pos += length;
    return 1;
}

static PyObject *misspelled(PyObject *self, PyObject *args) {
    PyObject *ids_obj, *counts_obj, *texts, *entries_obj, *flat_obj;
    Py_ssize_t first;
    if (!PyArg_ParseTuple(args, "OOO!OOn", &ids_obj, &counts_obj, &PyList_Type, &texts, &entries_obj, &flat_obj,
                          &first))
        return NULL;
    Py_buffer ids_b, counts_b, entries_b, flat_b;
    uint8_t *own = NULL;  /* a non-ASCII text's UTF-8, made here: CPython's would stay on the str */
    uint8_t *spelled = NULL;  /* the bytes a text's ids spell, written out */
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
    Py_ssize_t at = 0, result = -1, cap = 0, spelled_cap = 0;
    for (Py_ssize_t k = 0; k < first && k < n_texts; k++) at += counts[k];
    /* the first id outside the table (n_ids where none), so the loop below need not ask each id */
    int32_t bad = 0, n32 = n_table < INT32_MAX ? (int32_t)n_table : INT32_MAX;
    for (Py_ssize_t i = at; i < n_ids; i++) bad |= (uint32_t)ids[i] >= (uint32_t)n32;  /* vectorized */
    Py_ssize_t outside = n_ids;
    if (bad)
        for (outside = at; (uint32_t)ids[outside] < (uint64_t)n_table; outside++) {}
    for (Py_ssize_t k = first; k < n_texts; k++) {
        PyObject *text = PyList_GET_ITEM(texts, k);
        const uint8_t *bytes;
        Py_ssize_t size;
        if (PyBytes_Check(text)) {  /* its UTF-8 already (`utf8`, as the encoder took it) */
            bytes = (const uint8_t *)PyBytes_AS_STRING(text);
            size = PyBytes_GET_SIZE(text);
        } else if (!PyUnicode_Check(text)) {
            PyErr_SetString(PyExc_TypeError, "texts must be str or bytes");
            goto fail;
        } else if (PyUnicode_IS_ASCII(text)) {
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
        if (end > outside) {  /* the id outside the table is this text's */
            result = k;
            break;
        }
        if (size + SLACK > spelled_cap) {
            uint8_t *grown = PyMem_Realloc(spelled, (size_t)(size + SLACK));
            if (grown == NULL) {
                PyErr_NoMemory();
                goto fail;
            }
            spelled = grown;
            spelled_cap = size + SLACK;
        }
        /* The ids' bytes are written out, each token's 8-byte head whatever its length (the next one
         * overwrites what is past its end), and the text compared with them once at the end: a token
         * costs a load, a store and its length, where comparing token by token cost ~40 instructions. */
        while (at < end) {
            Py_ssize_t stop = at + BLOCK < end ? at + BLOCK : end;
            if (stop + PREFETCH <= n_ids) {
                for (; at < stop; at++) {
                    /* a later token's entry fetched while this one is written (a prefetch never faults) */
                    uintptr_t ahead = (uintptr_t)(uint32_t)ids[at + PREFETCH] << 4;
                    __builtin_prefetch((const void *)((uintptr_t)table + ahead));
                    if (!spell_token(table + ids[at], flat, flat_len, spelled, &pos, size)) goto refused;
                }
            } else {
                for (; at < stop; at++)
                    if (!spell_token(table + ids[at], flat, flat_len, spelled, &pos, size)) goto refused;
            }
            if (pos > size) break;
        }
    refused:
        if (at != end || pos != size || memcmp(spelled, bytes, (size_t)size) != 0) {
            result = k;
            break;
        }
    }
    PyMem_Free(own);
    PyMem_Free(spelled);
    PyBuffer_Release(&flat_b);
    PyBuffer_Release(&entries_b);
    PyBuffer_Release(&counts_b);
    PyBuffer_Release(&ids_b);
    return PyLong_FromSsize_t(result);
fail:
    PyMem_Free(own);
    PyMem_Free(spelled);
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

/* Blocks of POLY_BLOCK bytes, where SSE2 is (every x86-64): a block's sum  sum_i b_i X^(POLY_BLOCK-1-i)  is
 * taken as LIMBS sums of b_i * (14 bits of X^(POLY_BLOCK-1-i)), 16-bit products added in pairs by pmaddwd
 * (eight bytes per instruction), then joined by LIMBS multiplications mod 2^61 - 1: ~3 instructions
 * a byte, where the tables' lookups took ~13 (the hash was ~9% of a pretraining worker). The bounds:
 * a limb is below 2^14, a byte 2^8, a lane adds 2 * POLY_BLOCK / 8 products: below 2^29, within int32. */
#define POLY_BLOCK 512
#define LIMBS 5  /* 5 * 14 bits hold a number below 2^61 */
typedef Py_ssize_t (*BlockLoop)(const uint8_t *, Py_ssize_t, uint64_t *);
static Py_ssize_t poly_blocks_none(const uint8_t *b, Py_ssize_t n, uint64_t *h) { return 0; }
#if defined(__SSE2__)
static int16_t BLOCK_LIMBS[2][LIMBS][POLY_BLOCK] __attribute__((aligned(32)));
static uint64_t XBLOCK[2], LIMB_SCALE[LIMBS];  /* X^POLY_BLOCK; 2^(14 l) */

static void make_block_limbs(void) {
    for (int k = 0; k < 2; k++) {
        uint64_t power = 1;  /* X^(POLY_BLOCK-1-i), i from the last byte back */
        for (int i = POLY_BLOCK - 1; i >= 0; i--) {
            for (int l = 0; l < LIMBS; l++) BLOCK_LIMBS[k][l][i] = (int16_t)((power >> (14 * l)) & 0x3FFF);
            power = mul61(power, X[k]);
        }
        XBLOCK[k] = power;
    }
    for (int l = 0; l < LIMBS; l++) LIMB_SCALE[l] = (uint64_t)1 << (14 * l);
}

/* A block's LIMBS lane sums (`acc`, four or eight int32 lanes each) joined into the running hash. */
static void join_block(const uint32_t *lanes, int width, uint64_t *h) {
    for (int k = 0; k < 2; k++) {
        uint64_t sum = 0;
        for (int l = 0; l < LIMBS; l++) {
            uint64_t limb = 0;
            for (int q = 0; q < width; q++) limb += lanes[(k * LIMBS + l) * width + q];
            sum = reduce61(sum + mul61(limb, LIMB_SCALE[l]));
        }
        h[k] = reduce61(mul61(h[k], XBLOCK[k]) + sum);
    }
}

/* The hash going on over n / POLY_BLOCK whole blocks at b (SSE2: eight bytes a pmaddwd); returns the
 * bytes it took. */
static Py_ssize_t poly_blocks_sse2(const uint8_t *b, Py_ssize_t n, uint64_t *h) {
    const __m128i zero = _mm_setzero_si128();
    Py_ssize_t done = 0;
    for (; done + POLY_BLOCK <= n; done += POLY_BLOCK) {
        __m128i acc[2 * LIMBS];
        for (int a = 0; a < 2 * LIMBS; a++) acc[a] = zero;
        for (int i = 0; i < POLY_BLOCK; i += 16) {
            __m128i bytes = _mm_loadu_si128((const __m128i *)(b + done + i));
            __m128i half[2] = {_mm_unpacklo_epi8(bytes, zero), _mm_unpackhi_epi8(bytes, zero)};
            for (int a = 0; a < 2 * LIMBS; a++)
                for (int j = 0; j < 2; j++)
                    acc[a] = _mm_add_epi32(acc[a], _mm_madd_epi16(
                        half[j], _mm_load_si128((const __m128i *)&BLOCK_LIMBS[a / LIMBS][a % LIMBS][i + 8 * j])));
        }
        uint32_t lanes[2 * LIMBS * 4];
        for (int a = 0; a < 2 * LIMBS; a++) _mm_storeu_si128((__m128i *)(lanes + 4 * a), acc[a]);
        join_block(lanes, 4, h);
    }
    return done;
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
/* The same with AVX2: sixteen bytes a vpmaddwd, twice as many per instruction. */
__attribute__((target("avx2"))) static Py_ssize_t poly_blocks_avx2(const uint8_t *b, Py_ssize_t n, uint64_t *h) {
    Py_ssize_t done = 0;
    for (; done + POLY_BLOCK <= n; done += POLY_BLOCK) {
        __m256i acc[2 * LIMBS];
        for (int a = 0; a < 2 * LIMBS; a++) acc[a] = _mm256_setzero_si256();
        for (int i = 0; i < POLY_BLOCK; i += 16) {
            __m256i words = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(b + done + i)));
            for (int a = 0; a < 2 * LIMBS; a++)
                acc[a] = _mm256_add_epi32(acc[a], _mm256_madd_epi16(
                    words, _mm256_load_si256((const __m256i *)&BLOCK_LIMBS[a / LIMBS][a % LIMBS][i])));
        }
        uint32_t lanes[2 * LIMBS * 8];
        for (int a = 0; a < 2 * LIMBS; a++) _mm256_storeu_si256((__m256i *)(lanes + 8 * a), acc[a]);
        join_block(lanes, 8, h);
    }
    return done;
}
#endif

#else
static void make_block_limbs(void) {}
#endif

/* The block loops, the fastest this machine runs first (`poly_path` picks another, for the tests). */
static const struct { const char *name; BlockLoop loop; } PATHS[] = {
#if defined(__SSE2__) && defined(__GNUC__) && defined(__x86_64__)
    {"avx2", poly_blocks_avx2},
#endif
#if defined(__SSE2__)
    {"sse2", poly_blocks_sse2},
#endif
    {"scalar", poly_blocks_none}};
#define N_PATHS ((int)(sizeof(PATHS) / sizeof(PATHS[0])))
static int poly_at = N_PATHS - 1;  /* set as the module loads (`choose_path`) */
#define poly_blocks (PATHS[poly_at].loop)

static int path_runs(int k) {
#if defined(__GNUC__) && defined(__x86_64__)
    if (strcmp(PATHS[k].name, "avx2") == 0) return __builtin_cpu_supports("avx2");
#endif
    return 1;
}

static void choose_path(void) {
    for (poly_at = 0; !path_runs(poly_at); poly_at++) {}
}

/* poly_path(name=None) -> str: the block loop the hash runs ("avx2", "sse2" or "scalar"), after
 * switching to `name` where given (a ValueError where this machine cannot run it). */
static PyObject *poly_path(PyObject *self, PyObject *args) {
    const char *name = NULL;
    if (!PyArg_ParseTuple(args, "|s", &name)) return NULL;
    for (int k = 0; name != NULL && k <= N_PATHS; k++) {
        if (k == N_PATHS) {
            PyErr_Format(PyExc_ValueError, "%s: not a block loop this machine runs", name);
            return NULL;
        }
        if (strcmp(PATHS[k].name, name) == 0 && path_runs(k)) {
            poly_at = k;
            break;
        }
    }
    return PyUnicode_FromString(PATHS[poly_at].name);
}

/* The hash (*h1, *h2) going on over n bytes at b (Horner's rule: whole blocks, then eight bytes a
 * term for the rest). */
static void poly_run(const uint8_t *b, Py_ssize_t n, uint64_t *h1, uint64_t *h2) {
    uint64_t h[2] = {*h1, *h2};
    Py_ssize_t i = poly_blocks(b, n, h);
    uint64_t a1 = h[0], a2 = h[1];
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
    *h1 = a1, *h2 = a2;
}

/* X[k]^n mod 2^61 - 1, by squaring. */
static uint64_t power61(int k, uint64_t n) {
    uint64_t result = 1, base = X[k];
    for (; n; n >>= 1, base = mul61(base, base))
        if (n & 1) result = mul61(result, base);
    return result;
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
    uint64_t a1 = h1, a2 = h2;
    Py_BEGIN_ALLOW_THREADS
    poly_run(data.buf, data.len, &a1, &a2);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return Py_BuildValue("KK", (unsigned long long)a1, (unsigned long long)a2);
}

/* poly_each(data, ends) -> bytes: the hash of each piece of `data` on its own, pieces ending at `ends`
 * (int64, bytes, rising), as (h1, h2) uint64 pairs back to back: a worker hashes its samples once
 * each, and whoever lays them out in another order joins their hashes (`poly_join`) without reading
 * a byte of them. */
static PyObject *poly_each(PyObject *self, PyObject *args) {
    PyObject *data_obj, *ends_obj;
    if (!PyArg_ParseTuple(args, "OO", &data_obj, &ends_obj)) return NULL;
    Py_buffer data, ends_b;
    if (PyObject_GetBuffer(data_obj, &data, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (view(ends_obj, &ends_b, 8, "ends") < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    const int64_t *ends = ends_b.buf;
    Py_ssize_t k = ends_b.len / 8;
    PyObject *out = NULL;
    for (Py_ssize_t j = 0; j < k; j++)
        if (ends[j] < (j ? ends[j - 1] : 0) || ends[j] > data.len) {
            PyErr_SetString(PyExc_ValueError, "ends: rising, within the data");
            goto done;
        }
    out = PyBytes_FromStringAndSize(NULL, k * 16);
    if (out == NULL) goto done;
    uint64_t *h = (uint64_t *)PyBytes_AS_STRING(out);
    const uint8_t *b = data.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0, start = 0; j < k; start = ends[j++]) {
        h[2 * j] = h[2 * j + 1] = 0;
        poly_run(b + start, ends[j] - start, h + 2 * j, h + 2 * j + 1);
    }
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&ends_b);
    PyBuffer_Release(&data);
    return out;
}

/* poly_join(hashes, sizes, h1, h2) -> (h1, h2): the hash going on over pieces of `sizes` bytes (int64)
 * whose own hashes are `hashes` ((h1, h2) uint64 pairs), in that order: h * X^size + the piece's. */
static PyObject *poly_join(PyObject *self, PyObject *args) {
    PyObject *hashes_obj, *sizes_obj;
    unsigned long long h1, h2;
    if (!PyArg_ParseTuple(args, "OOKK", &hashes_obj, &sizes_obj, &h1, &h2)) return NULL;
    Py_buffer hashes_b, sizes_b;
    if (view(hashes_obj, &hashes_b, 8, "hashes") < 0) return NULL;
    if (view(sizes_obj, &sizes_b, 8, "sizes") < 0) {
        PyBuffer_Release(&hashes_b);
        return NULL;
    }
    const uint64_t *hashes = hashes_b.buf;
    const int64_t *sizes = sizes_b.buf;
    Py_ssize_t k = sizes_b.len / 8;
    PyObject *out = NULL;
    if (hashes_b.len / 8 != 2 * k || h1 >= P61 || h2 >= P61) {
        PyErr_SetString(PyExc_ValueError, "a (h1, h2) pair per size expected, each below 2^61 - 1");
        goto done;
    }
    uint64_t a[2] = {h1, h2};
    int bad = 0;
    for (Py_ssize_t j = 0; j < k; j++) {
        if (sizes[j] < 0 || hashes[2 * j] >= P61 || hashes[2 * j + 1] >= P61) {
            bad = 1;
            break;
        }
        for (int p = 0; p < 2; p++)
            a[p] = reduce61(mul61(a[p], power61(p, (uint64_t)sizes[j])) + hashes[2 * j + p]);
    }
    if (bad)
        PyErr_SetString(PyExc_ValueError, "a size below 0, or a hash not below 2^61 - 1");
    else
        out = Py_BuildValue("KK", (unsigned long long)a[0], (unsigned long long)a[1]);
done:
    PyBuffer_Release(&sizes_b);
    PyBuffer_Release(&hashes_b);
    return out;
}

/* pack_rows(ids, mask, starts, lengths, order, row_sizes, row_tokens, width, pad, out_ids, out_mask):
 * packed rows laid out (`formats.packing.padded_rows`): row r holds the next row_sizes[r] samples of
 * `order` (each sample k: ids and mask [starts[k], starts[k] + lengths[k])), row_tokens[r] tokens in
 * all, then `pad` ids (mask 0) up to `width`. ids and out_ids: items of 2 or 4 bytes alike; the
 * others int64 (mask uint8). A copy a sample, the GIL let go: done in Python, a slice object a sample
 * took the writer thread's time and the main thread's GIL with it (~4 s of a 2 GB alpaca run). */
static PyObject *pack_rows(PyObject *self, PyObject *args) {
    PyObject *objs[9];  /* ids, mask, starts, lengths, order, row_sizes, row_tokens, out_ids, out_mask */
    Py_ssize_t width;
    long long pad;
    if (!PyArg_ParseTuple(args, "OOOOOOOnLOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6],
                          &width, &pad, &objs[7], &objs[8]))
        return NULL;
    Py_buffer b[9];
    int got = 0;
    for (; got < 9; got++)
        if (PyObject_GetBuffer(objs[got], &b[got], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE * (got >= 7)) < 0)
            goto done;
    Py_ssize_t item = b[0].itemsize;
    int ok = (item == 2 || item == 4) && b[7].itemsize == item && b[1].itemsize == 1 && b[8].itemsize == 1 && width >= 0;
    for (int k = 2; k < 7; k++) ok = ok && b[k].itemsize == 8;
    const int64_t *starts = b[2].buf, *lengths = b[3].buf, *order = b[4].buf, *sizes = b[5].buf, *tokens = b[6].buf;
    Py_ssize_t n_ids = b[0].len / item, n_samples = b[2].len / 8, n_order = b[4].len / 8, rows = b[5].len / 8;
    ok = ok && b[1].len == n_ids && b[3].len / 8 == n_samples && b[6].len / 8 == rows
            && b[7].len / item == rows * width && b[8].len == rows * width;
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "pack_rows: arrays of the wrong types or sizes");
        goto done;
    }
    const uint8_t *ids = b[0].buf, *mask = b[1].buf;
    uint8_t *out_ids = b[7].buf, *out_mask = b[8].buf;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t taken = 0;
    for (Py_ssize_t r = 0; r < rows && !bad; r++) {
        Py_ssize_t at = r * width, end = at + tokens[r];
        if (sizes[r] < 0 || taken + sizes[r] > n_order || tokens[r] < 0 || tokens[r] > width) {
            bad = 1;
            break;
        }
        for (Py_ssize_t j = taken; j < taken + sizes[r]; j++) {
            int64_t k = order[j];
            if (k < 0 || k >= n_samples || starts[k] < 0 || lengths[k] < 0 || starts[k] + lengths[k] > n_ids ||
                at + lengths[k] > end) {
                bad = 1;
                break;
            }
            memcpy(out_ids + at * item, ids + starts[k] * item, (size_t)(lengths[k] * item));
            memcpy(out_mask + at, mask + starts[k], (size_t)lengths[k]);
            at += lengths[k];
        }
        if (bad || at != end) {  /* the row's samples must hold exactly its tokens */
            bad = 1;
            break;
        }
        taken += sizes[r];
        memset(out_mask + end, 0, (size_t)(r * width + width - end));
        if (item == 4) {
            int32_t v = (int32_t)pad;
            for (Py_ssize_t t = end; t < r * width + width; t++) memcpy(out_ids + t * 4, &v, 4);
        } else {
            uint16_t v = (uint16_t)pad;
            for (Py_ssize_t t = end; t < r * width + width; t++) memcpy(out_ids + t * 2, &v, 2);
        }
    }
    Py_END_ALLOW_THREADS
    if (bad) PyErr_SetString(PyExc_ValueError, "pack_rows: the plan does not fit its samples");
done:
    for (int k = 0; k < got; k++) PyBuffer_Release(&b[k]);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
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
 * newline after <|im_end|> is looked for there even across a sample's end, as numpy's did).
 *
 * Every byte it asks about lies a few tokens after an im_start (the header, an empty think block) or
 * at the im_end, so it finds them by walking from there: no byte offset of every token is made (an
 * array of them, 8 bytes a token, took most of the time). */
static const char HEADER[] = "<|im_start|>assistant\n", EMPTY_THINK[] = "<think>\n\n</think>\n\n";

typedef struct {
    const int32_t *ids;
    const int64_t *table;
    const uint8_t *flat;
    Py_ssize_t n;
} Stream;

static inline int64_t token_length(const Stream *s, Py_ssize_t t) {
    return s->table[s->ids[t] + 1] - s->table[s->ids[t]];
}

/* The token holding the byte `*at` bytes after token `tok`'s first byte (`*at` becomes its place in
 * that token); n where the stream ends before it. */
static Py_ssize_t holding(const Stream *s, Py_ssize_t tok, int64_t *at) {
    for (; tok < s->n; tok++) {
        int64_t length = token_length(s, tok);
        if (*at < length) return tok;
        *at -= length;
    }
    return s->n;
}

/* Whether the bytes from `at` bytes after token `tok`'s first byte are `pattern`. */
static int spells_at(const Stream *s, Py_ssize_t tok, int64_t at, const char *pattern, size_t length) {
    tok = holding(s, tok, &at);
    for (size_t k = 0; k < length; k++) {
        if (tok >= s->n) return 0;
        if (s->flat[s->table[s->ids[tok]] + at] != (uint8_t)pattern[k]) return 0;
        if (++at == token_length(s, tok)) {  /* on to the next token that spells a byte */
            at = 0;
            tok = holding(s, tok + 1, &at);
        }
    }
    return 1;
}

/* The tokens touching bytes [a, b) counted from token `tok`'s first byte: [first, last]; none where
 * b <= a (first > last). */
static void touching(const Stream *s, Py_ssize_t tok, int64_t a, int64_t b, Py_ssize_t range[2]) {
    range[0] = 1, range[1] = 0;
    if (b <= a) return;
    int64_t at = a;
    Py_ssize_t first = holding(s, tok, &at);
    at += b - a - 1;  /* the last byte, from `first`'s first byte */
    range[0] = first, range[1] = holding(s, first, &at);
    if (range[1] >= s->n) range[1] = s->n - 1;
}

/* The first t in [from, to) with ids[t] == value, else `to`: four ids a compare where SSE2 is (a
 * sample's control ids are a few in a thousand; a loop of one id a turn was half the check's time). */
static Py_ssize_t next_id(const int32_t *ids, Py_ssize_t from, Py_ssize_t to, int32_t value) {
#if defined(__SSE2__)
    const __m128i wanted = _mm_set1_epi32(value);
    for (; from + 4 <= to; from += 4) {
        int hits = _mm_movemask_ps(_mm_castsi128_ps(
            _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(ids + from)), wanted)));
        if (hits) return from + __builtin_ctz((unsigned)hits);
    }
#endif
    for (; from < to; from++)
        if (ids[from] == value) return from;
    return to;
}

static void mark(uint8_t *mask, const Py_ssize_t range[2]) {
    if (range[1] >= range[0]) memset(mask + range[0], 1, (size_t)(range[1] - range[0] + 1));
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

    Stream s = {ids_b.buf, starts_b.buf, flat_b.buf, ids_b.len / 4};
    const int64_t *sample_ends = ends_b.buf;
    Py_ssize_t n_samples = ends_b.len / 8;
    int64_t n_table = starts_b.len / 8 - 1;
    int32_t bad = 0;
    for (Py_ssize_t t = 0; t < s.n; t++)  /* (the spelling check refuses these first; vectorized) */
        bad |= (uint32_t)s.ids[t] >= (uint32_t)n_table;
    if (bad) {
        for (Py_ssize_t t = 0; t < s.n; t++)
            if (s.ids[t] < 0 || s.ids[t] >= n_table) {
                PyErr_Format(PyExc_ValueError, "id %d outside the table", (int)s.ids[t]);
                break;
            }
        goto flat;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, s.n);
    if (out == NULL) goto flat;
    uint8_t *mask = (uint8_t *)PyBytes_AS_STRING(out);
    memset(mask, 0, (size_t)s.n);
    const int64_t header = (int64_t)(sizeof HEADER - 1), think = (int64_t)(sizeof EMPTY_THINK - 1);
    Py_ssize_t begin = 0, closing = -1;  /* the last im_end found, and the head it was found for */
    for (Py_ssize_t k = 0; k < n_samples; k++) {
        Py_ssize_t end = sample_ends[k] < s.n ? (Py_ssize_t)sample_ends[k] : s.n;
        Py_ssize_t last[2][2] = {{1, 0}, {1, 0}};  /* the sample's last turn's tokens, under last_only */
        for (Py_ssize_t h = next_id(s.ids, begin, end, im_start); h < end;
             h = next_id(s.ids, h + 1, end, im_start)) {
            if (!spells_at(&s, h, 0, HEADER, (size_t)header)) continue;
            if (closing <= h) closing = next_id(s.ids, h + 1, s.n, im_end);
            if (closing >= end) continue;  /* no im_end in the sample after it */
            /* Bytes from h's first one: the content starts at `header`; the im_end is token `closing`,
             * and the byte after it (a newline or not) the first of the next token spelling one. */
            int64_t first = span == 2 ? header - 1 : span == 3 ? 0 : header;
            Py_ssize_t after = closing;
            if (span != 1) {
                int64_t at = token_length(&s, closing);
                after = holding(&s, closing, &at);
                if (after >= s.n || s.flat[s.table[s.ids[after]] + at] != '\n') after = closing;
            }
            Py_ssize_t piece[2][2];
            if (empty_think && spells_at(&s, h, header, EMPTY_THINK, (size_t)think)) {
                touching(&s, h, first, header, piece[0]);
                touching(&s, h, header + think, header + think + 1, piece[1]);
                piece[1][1] = after;
            } else {
                touching(&s, h, first, first + 1, piece[0]);
                piece[0][1] = after;
                piece[1][0] = 1, piece[1][1] = 0;
            }
            if (last_only) {
                memcpy(last, piece, sizeof piece);
            } else {
                mark(mask, piece[0]);
                mark(mask, piece[1]);
            }
        }
        mark(mask, last[0]);
        mark(mask, last[1]);
        begin = end;
    }
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

/* The length of the valid UTF-8 sequence at p (its lead >= 0x80) and its code point; 0 where it is not
 * one (a stray continuation byte, an overlong form, a surrogate, beyond U+10FFFF, cut short). */
static inline int utf8_at(const uint8_t *p, const uint8_t *end, Py_UCS4 *cp) {
    uint8_t b0 = p[0];
    if (b0 < 0xC2) return 0;
    if (b0 < 0xE0) {
        if (end - p < 2 || (p[1] & 0xC0) != 0x80) return 0;
        *cp = (Py_UCS4)(b0 & 0x1F) << 6 | (p[1] & 0x3F);
        return 2;
    }
    if (b0 < 0xF0) {
        if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if ((b0 == 0xE0 && p[1] < 0xA0) || (b0 == 0xED && p[1] >= 0xA0)) return 0;
        *cp = (Py_UCS4)(b0 & 0x0F) << 12 | (Py_UCS4)(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
        return 3;
    }
    if (b0 < 0xF5) {
        if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        if ((b0 == 0xF0 && p[1] < 0x90) || (b0 == 0xF4 && p[1] >= 0x90)) return 0;
        *cp = (Py_UCS4)(b0 & 0x07) << 18 | (Py_UCS4)(p[1] & 0x3F) << 12 | (Py_UCS4)(p[2] & 0x3F) << 6 | (p[3] & 0x3F);
        return 4;
    }
    return 0;
}

/* Whether UTF-8 `b` holds a code point whose bit in `stable` is 0 (or is not valid UTF-8): every byte below
 * 0xCC is ASCII, a continuation, or the lead of a code point below U+0300, all stable; sixteen bytes a
 * compare pass where none is a lead of 0xCC and above. */
static int utf8_suspect(const uint8_t *b, Py_ssize_t n, const uint8_t *stable) {
    const uint8_t *p = b, *end = b + n;
    while (p < end) {
#if defined(__SSE2__)
        const __m128i low = _mm_set1_epi8((char)0xCC);
        while (end - p >= 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)p);
            int m = _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_max_epu8(v, low), v));
            if (m) {
                p += __builtin_ctz((unsigned)m);
                break;
            }
            p += 16;
        }
#endif
        while (p < end && *p < 0xCC) p++;
        if (p >= end) return 0;
        Py_UCS4 c = 0;
        int len = utf8_at(p, end, &c);
        if (!len || !(stable[c >> 3] >> (c & 7) & 1)) return 1;
        p += len;
    }
    return 0;
}

/* nfc_suspects(texts, stable) -> list of int: the texts (str, or their UTF-8 as bytes) that may not be in NFC,
 * by index: those holding a
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
        int suspect = 0;
        if (PyBytes_Check(text)) {
            suspect = utf8_suspect((const uint8_t *)PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text), stable);
        } else if (!PyUnicode_Check(text)) {
            PyErr_SetString(PyExc_TypeError, "texts must be str or UTF-8 bytes");
            Py_CLEAR(out);
            break;
        }
        int kind = PyBytes_Check(text) ? 0 : PyUnicode_KIND(text);
        if (kind == 0) {
            if (suspect) {
                PyObject *index = PyLong_FromSsize_t(k);
                if (index == NULL || PyList_Append(out, index) < 0) Py_CLEAR(out);
                Py_XDECREF(index);
            }
            continue;
        }
        if (kind == PyUnicode_1BYTE_KIND) continue;  /* ASCII or Latin-1 */
        const void *data = PyUnicode_DATA(text);
        Py_ssize_t n = PyUnicode_GET_LENGTH(text);
        if (kind == PyUnicode_2BYTE_KIND) {
            const Py_UCS2 *c = data;
            Py_ssize_t i = 0;
#if defined(__SSE2__)
            /* Eight characters a compare: a block all below U+0300 (most of a Latin text whose quotes or dashes
             * made it 2-byte) is passed at once; a block holding one or more is tested character by character. */
            const __m128i flip = _mm_set1_epi16((short)0x8000), below = _mm_set1_epi16((short)(0x02FF ^ 0x8000));
            for (; i + 8 <= n && !suspect; i += 8) {
                __m128i v = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(c + i)), flip);
                if (!_mm_movemask_epi8(_mm_cmpgt_epi16(v, below))) continue;
                for (Py_ssize_t j = i; j < i + 8 && !suspect; j++)
                    suspect = c[j] >= 0x300 && !(stable[c[j] >> 3] >> (c[j] & 7) & 1);
            }
#endif
            for (; i < n && !suspect; i++)
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

/* nfc_unsettled(texts, indices, props, pairs) -> list of int: of the texts at `indices` (the suspects of
 * `nfc_suspects`), those this finer check cannot prove to be their own NFC. `props` (uint16, one a code
 * point below PROPS_END; `text.nfc` derives them from Python's tables): the canonical combining class
 * in the low byte, then NFC_MAYBE (the second of a pair that composes), NFC_NO (NFC changes it alone),
 * NFC_SPLITS (NFD changes it). `pairs` (uint64, sorted): first << 21 | second of each pair that composes.
 * A text is settled when no character is NFC_NO, its non-starters are in canonical order, no non-starter
 * or second of a pair follows a starter that splits (what NFD puts after it could reorder or compose),
 * and no second of a pair follows a starter it composes with (blocked or not: the check may send a text
 * on that is NFC, never the reverse). Python's is_normalized then asks only the others: Indic and
 * Arabic texts hold viramas and vowel signs that the bit test suspects and nothing changes. */
#define PROPS_END 0x30000
#define NFC_MAYBE 0x100
#define NFC_NO 0x200
#define NFC_SPLITS 0x400

/* Where `key` is among the n sorted `keys`; -1 where it is not. */
static Py_ssize_t find64(const uint64_t *keys, Py_ssize_t n, uint64_t key) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (keys[mid] < key) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && keys[lo] == key ? lo : -1;
}

static int settled(PyObject *text, const uint16_t *props, const uint64_t *pairs, Py_ssize_t n_pairs) {
    int bytes = PyBytes_Check(text), kind = bytes ? 0 : PyUnicode_KIND(text);
    const void *data = bytes ? (const void *)PyBytes_AS_STRING(text) : PyUnicode_DATA(text);
    Py_ssize_t n = bytes ? PyBytes_GET_SIZE(text) : PyUnicode_GET_LENGTH(text);
    const uint8_t *u8 = data;
    int64_t starter = -1;  /* the last starter */
    int splits = 0, before = 0;  /* whether it splits under NFD; the last character's class */
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c;
        if (!bytes) {
            c = PyUnicode_READ(kind, data, i);
        } else if (u8[i] < 0x80) {
            c = u8[i];
        } else {  /* (not UTF-8: unproven, for the caller's decoding to say why) */
            int len = utf8_at(u8 + i, u8 + n, &c);
            if (!len) return 0;
            i += len - 1;
        }
        unsigned p = c < PROPS_END ? props[c] : (c > 0x10FFFF ? NFC_NO : 0);
        unsigned ccc = p & 0xFF;
        if (p & NFC_NO) return 0;
        if (ccc && (ccc < (unsigned)before || splits || (p & NFC_SPLITS))) return 0;
        if ((p & NFC_MAYBE) && (splits || (starter >= 0 && find64(pairs, n_pairs, (uint64_t)starter << 21 | c) >= 0)))
            return 0;
        if (!ccc) {
            starter = c;
            splits = (p & NFC_SPLITS) != 0;
        }
        before = (int)ccc;
    }
    return 1;
}

static PyObject *nfc_unsettled(PyObject *self, PyObject *args) {
    PyObject *texts, *indices, *props_obj, *pairs_obj;
    if (!PyArg_ParseTuple(args, "O!O!OO", &PyList_Type, &texts, &PyList_Type, &indices, &props_obj, &pairs_obj))
        return NULL;
    Py_buffer props_b, pairs_b;
    if (view(props_obj, &props_b, 2, "props") < 0) return NULL;
    if (view(pairs_obj, &pairs_b, 8, "pairs") < 0) {
        PyBuffer_Release(&props_b);
        return NULL;
    }
    PyObject *out = NULL;
    if (props_b.len / 2 < PROPS_END) {
        PyErr_SetString(PyExc_ValueError, "props: one for every code point below U+30000 expected");
        goto done;
    }
    out = PyList_New(0);
    for (Py_ssize_t j = 0; out != NULL && j < PyList_GET_SIZE(indices); j++) {
        PyObject *index = PyList_GET_ITEM(indices, j);
        Py_ssize_t k = PyLong_AsSsize_t(index);
        if (k == -1 && PyErr_Occurred()) {
            Py_CLEAR(out);
            break;
        }
        if (k < 0 || k >= PyList_GET_SIZE(texts) ||
            !(PyUnicode_Check(PyList_GET_ITEM(texts, k)) || PyBytes_Check(PyList_GET_ITEM(texts, k)))) {
            PyErr_SetString(PyExc_ValueError, "indices: each the index of a str or bytes of texts");
            Py_CLEAR(out);
            break;
        }
        if (!settled(PyList_GET_ITEM(texts, k), props_b.buf, pairs_b.buf, pairs_b.len / 8) &&
            PyList_Append(out, index) < 0)
            Py_CLEAR(out);
    }
done:
    PyBuffer_Release(&pairs_b);
    PyBuffer_Release(&props_b);
    return out;
}

/* best_fit_rows(sorted_lengths, capacity, row_of) -> rows: `formats.packing.pack`'s best fit decreasing over
 * samples sorted longest first (ties in index order), each sample's row written to row_of; → the rows opened.
 * The samples of one length go together, as Python dealt them (a Python loop a length cost a packed SFT run's
 * main thread ~0.7 s a GB of chats): open rows wait in buckets by their free space (`spaces` ascending, each
 * bucket's rows in the order they came); walking up from the length, a bucket whose rows all fill is taken
 * whole, in order, and the one that ends the samples gives its last rows; the rest go to new rows, `per` a row.
 * The rows that took samples then join the bucket of their new free space, at its end, in the order they took
 * them, unless less is left than the shortest sample holds. */
typedef struct {
    int64_t space, n, cap;
    int64_t *rows;
} Bucket;

static int bucket_add(Bucket *b, const int64_t *rows, int64_t n) {
    if (b->n + n > b->cap) {
        int64_t cap = b->cap ? b->cap : 4;
        while (cap < b->n + n) cap *= 2;
        int64_t *grown = PyMem_Realloc(b->rows, (size_t)cap * sizeof(int64_t));
        if (grown == NULL) return -1;
        b->rows = grown, b->cap = cap;
    }
    memcpy(b->rows + b->n, rows, (size_t)n * sizeof(int64_t));
    b->n += n;
    return 0;
}

typedef struct {
    Bucket *b;     /* by free space, ascending */
    int64_t n, cap;
    int64_t *takers, *counts;  /* this length's rows that took samples, and how many each */
    int64_t taken, *move_space, *move_count, moves;  /* the takers' segments and the space each has left */
} Rows;

static int64_t bucket_at(const Rows *r, int64_t space) {  /* the first bucket with at least `space` free */
    int64_t lo = 0, hi = r->n;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (r->b[mid].space < space) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static void take(Rows *r, const int64_t *rows, int64_t n, int64_t per, int64_t full, int64_t rest, int64_t space,
                 int64_t s) {
    for (int64_t k = 0; k < n; k++) {
        r->takers[r->taken + k] = rows[k];
        r->counts[r->taken + k] = k < full ? per : rest;
    }
    r->taken += n;
    r->move_space[r->moves] = space - per * s, r->move_count[r->moves++] = full;
    if (n > full) r->move_space[r->moves] = space - rest * s, r->move_count[r->moves++] = n - full;
}

static int settle(Rows *r, int64_t smallest) {  /* the takers to the buckets of their new free space */
    int64_t at = 0;
    for (int64_t m = 0; m < r->moves; at += r->move_count[m], m++) {
        int64_t space = r->move_space[m], count = r->move_count[m];
        if (space < smallest || count == 0) continue;
        int64_t i = bucket_at(r, space);
        if (i == r->n || r->b[i].space != space) {
            if (r->n == r->cap) {
                int64_t cap = r->cap ? 2 * r->cap : 64;
                Bucket *grown = PyMem_Realloc(r->b, (size_t)cap * sizeof(Bucket));
                if (grown == NULL) return -1;
                r->b = grown, r->cap = cap;
            }
            memmove(r->b + i + 1, r->b + i, (size_t)(r->n - i) * sizeof(Bucket));
            r->b[i] = (Bucket){space, 0, 0, NULL};
            r->n++;
        }
        if (bucket_add(&r->b[i], r->takers + at, count) < 0) return -1;
    }
    return 0;
}

/* `count` samples of length `s` to the open rows, tightest first; → those left for new rows. */
static int64_t fill_open(Rows *r, int64_t s, int64_t count) {
    int64_t first = bucket_at(r, s), i = first, left = count;
    while (left && i < r->n) {
        Bucket *b = &r->b[i];
        int64_t per = b->space / s;
        if (b->n * per <= left) {  /* every row of the bucket fills up with these samples */
            take(r, b->rows, b->n, per, b->n, 0, b->space, s);
            left -= b->n * per;
            b->n = 0;
            i++;
            continue;
        }
        int64_t full = left / per, rest = left % per, used = full + (rest > 0);
        take(r, b->rows + b->n - used, used, per, full, rest, b->space, s);
        b->n -= used;
        left = 0;
        if (b->n == 0) i++;
    }
    for (int64_t k = first; k < i; k++) PyMem_Free(r->b[k].rows);
    memmove(r->b + first, r->b + i, (size_t)(r->n - i) * sizeof(Bucket));
    r->n -= i - first;
    return left;
}

static PyObject *best_fit_rows(PyObject *self, PyObject *args) {
    PyObject *lengths_obj, *out_obj;
    long long capacity;
    if (!PyArg_ParseTuple(args, "OLO", &lengths_obj, &capacity, &out_obj)) return NULL;
    Py_buffer lb, ob;
    if (view(lengths_obj, &lb, 8, "sorted_lengths") < 0) return NULL;
    if (view(out_obj, &ob, 8, "row_of") < 0) {
        PyBuffer_Release(&lb);
        return NULL;
    }
    const int64_t *len = lb.buf;
    int64_t *row_of = ob.buf, n = lb.len / 8, opened = 0;
    Rows r = {0};
    PyObject *result = NULL;
    if (ob.len / 8 != n || capacity < 1) {
        PyErr_SetString(PyExc_ValueError, "best_fit_rows: row_of must hold a row per sample, capacity be positive");
        goto done;
    }
    r.takers = PyMem_Malloc((size_t)(n + 1) * sizeof(int64_t)), r.counts = PyMem_Malloc((size_t)(n + 1) * sizeof(int64_t));
    r.move_space = PyMem_Malloc((size_t)(2 * n + 4) * sizeof(int64_t));
    r.move_count = PyMem_Malloc((size_t)(2 * n + 4) * sizeof(int64_t));
    if (!r.takers || !r.counts || !r.move_space || !r.move_count) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t smallest = n ? len[n - 1] : 1;
    for (int64_t g = 0, end; g < n; g = end) {
        int64_t s = len[g];
        if (s < 1 || s > capacity || (g && s > len[g - 1])) {
            PyErr_SetString(PyExc_ValueError, "best_fit_rows: lengths must be in 1..capacity, longest first");
            goto done;
        }
        for (end = g + 1; end < n && len[end] == s; end++) {}
        r.taken = r.moves = 0;
        int64_t left = fill_open(&r, s, end - g);
        if (left) {  /* new rows, `per` samples each, the last one the rest */
            int64_t per = capacity / s, full = left / per, rest = left % per, count = full + (rest > 0);
            int64_t *fresh = r.takers + r.taken;  /* (take copies them forward onto themselves: same place) */
            for (int64_t k = 0; k < count; k++) fresh[k] = opened + k;
            take(&r, fresh, count, per, full, rest, capacity, s);
            opened += count;
        }
        for (int64_t k = 0, at = g; k < r.taken; k++)
            for (int64_t c = 0; c < r.counts[k]; c++) row_of[at++] = r.takers[k];
        if (settle(&r, smallest) < 0) {
            PyErr_NoMemory();
            goto done;
        }
    }
    result = PyLong_FromLongLong(opened);
done:
    for (int64_t k = 0; k < r.n; k++) PyMem_Free(r.b[k].rows);
    PyMem_Free(r.b);
    PyMem_Free(r.takers), PyMem_Free(r.counts), PyMem_Free(r.move_space), PyMem_Free(r.move_count);
    PyBuffer_Release(&ob);
    PyBuffer_Release(&lb);
    return result;
}

/* nfc(text, props, dec_keys, dec_starts, dec_data, comp_keys, comp_values) -> str, or None: the text in
 * NFC, by the tables `text.nfc` derives from Python's unicodedata (a character's canonical decomposition,
 * each primary composite by its pair; Hangul by its rule), where unicodedata.normalize took ~250
 * instructions a character (a tenth of a pretraining worker's on a corpus of Arabic and Indic texts).
 * None where the text holds a surrogate (the caller asks unicodedata). The characters are decomposed,
 * the marks of each run put in canonical order (stable), and composed again: a character joins the last
 * starter where nothing between them blocks it and the pair has a primary composite. */
#define S_BASE 0xAC00
#define L_BASE 0x1100
#define V_BASE 0x1161
#define T_BASE 0x11A7
#define T_COUNT 28
#define N_COUNT 588
#define S_COUNT 11172

static inline unsigned nfc_class(const uint16_t *props, Py_UCS4 c) {
    return c < PROPS_END ? props[c] & 0xFF : 0;
}

static Py_UCS4 composite(Py_UCS4 first, Py_UCS4 second, const uint64_t *keys, const uint32_t *values,
                         Py_ssize_t n) {
    if (first >= L_BASE && first < L_BASE + 19 && second >= V_BASE && second < V_BASE + 21)
        return S_BASE + ((first - L_BASE) * 21 + (second - V_BASE)) * T_COUNT;
    if (first >= S_BASE && first < S_BASE + S_COUNT && (first - S_BASE) % T_COUNT == 0 && second > T_BASE &&
        second < T_BASE + T_COUNT)
        return first + (second - T_BASE);
    Py_ssize_t k = find64(keys, n, (uint64_t)first << 21 | second);
    return k < 0 ? 0 : values[k];
}

typedef struct {
    const uint16_t *props;
    const uint64_t *dec_keys;
    const uint32_t *dec_starts, *dec_data;
    const uint64_t *comp_keys;
    const uint32_t *comp_values;
    Py_ssize_t n_dec, n_comp, n_data;
} NfcTables;

/* Appends c's full canonical decomposition at out + *n (room for 4 characters: the longest is 4);
 * -1 where the tables are inconsistent. */
static int decompose(const NfcTables *t, Py_UCS4 c, Py_UCS4 *out, Py_ssize_t *n) {
    if (c >= S_BASE && c < S_BASE + S_COUNT) {
        Py_UCS4 s = c - S_BASE;
        out[(*n)++] = L_BASE + s / N_COUNT;
        out[(*n)++] = V_BASE + (s % N_COUNT) / T_COUNT;
        if (s % T_COUNT) out[(*n)++] = T_BASE + s % T_COUNT;
        return 0;
    }
    Py_ssize_t k = (c < PROPS_END && (t->props[c] & NFC_SPLITS)) ? find64(t->dec_keys, t->n_dec, c) : -1;
    if (k < 0) {
        out[(*n)++] = c;
        return 0;
    }
    uint32_t a = t->dec_starts[k], b = t->dec_starts[k + 1];
    if (b < a || b - a > 4 || b > (uint64_t)t->n_data) return -1;
    for (uint32_t j = a; j < b; j++) out[(*n)++] = t->dec_data[j];
    return 0;
}

/* The decomposed characters buf[0..n) put in canonical order and composed, in place; → their new count. */
static Py_ssize_t order_and_compose(const NfcTables *t, Py_UCS4 *buf, Py_ssize_t n) {
    for (Py_ssize_t i = 1; i < n; i++) {  /* insertion sort of each run of marks by class, stable */
        unsigned cc = nfc_class(t->props, buf[i]);
        if (!cc) continue;
        Py_UCS4 c = buf[i];
        Py_ssize_t j = i;
        while (j > 0 && nfc_class(t->props, buf[j - 1]) > cc) {
            buf[j] = buf[j - 1];
            j--;
        }
        buf[j] = c;
    }
    Py_ssize_t out = 0, starter = -1;
    int last = -1;  /* the class of the last character kept after the starter; -1: none yet */
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = buf[i];
        unsigned cc = nfc_class(t->props, c);
        if (starter >= 0 && (last < 0 || (unsigned)last < cc) && c < PROPS_END && (t->props[c] & NFC_MAYBE)) {
            Py_UCS4 joined = composite(buf[starter], c, t->comp_keys, t->comp_values, t->n_comp);
            if (joined) {
                buf[starter] = joined;
                continue;
            }
        }
        if (!cc) {
            starter = out;
            last = -1;
        } else {
            last = (int)cc;
        }
        buf[out++] = c;
    }
    return out;
}

static PyObject *nfc_text(PyObject *text, const NfcTables *t) {
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    /* 4 bytes a character and a little more: a decomposition rarely adds many (grown where it does) */
    Py_ssize_t cap = n + n / 8 + 8, m = 0;
    if (n > PY_SSIZE_T_MAX / 8) return PyErr_NoMemory();
    Py_UCS4 *buf = PyMem_Malloc((size_t)cap * sizeof(Py_UCS4));
    if (buf == NULL) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (m + 4 > cap) {  /* room for the longest decomposition */
            Py_UCS4 *grown = PyMem_Realloc(buf, (size_t)(cap *= 2) * sizeof(Py_UCS4));
            if (grown == NULL) {
                PyMem_Free(buf);
                return PyErr_NoMemory();
            }
            buf = grown;
        }
        if (c >= 0xD800 && c <= 0xDFFF) {
            PyMem_Free(buf);
            Py_RETURN_NONE;
        }
        if (decompose(t, c, buf, &m) < 0) {
            PyMem_Free(buf);
            PyErr_SetString(PyExc_ValueError, "nfc: a decomposition outside the tables");
            return NULL;
        }
    }
    m = order_and_compose(t, buf, m);
    PyObject *out = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, buf, m);
    PyMem_Free(buf);
    return out;
}

static PyObject *nfc(PyObject *self, PyObject *args) {
    PyObject *text, *objs[6];
    if (!PyArg_ParseTuple(args, "UOOOOOO", &text, &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5]))
        return NULL;
    static const Py_ssize_t items[6] = {2, 8, 4, 4, 8, 4};
    static const char *names[6] = {"props", "dec_keys", "dec_starts", "dec_data", "comp_keys", "comp_values"};
    Py_buffer b[6];
    int held = 0;
    PyObject *out = NULL;
    for (; held < 6; held++)
        if (view(objs[held], &b[held], items[held], names[held]) < 0) goto done;
    NfcTables t = {b[0].buf, b[1].buf, b[2].buf, b[3].buf, b[4].buf, b[5].buf,
                   b[1].len / 8, b[4].len / 8, b[3].len / 4};
    if (b[0].len / 2 < PROPS_END || b[2].len / 4 != t.n_dec + 1 || b[5].len / 4 != t.n_comp) {
        PyErr_SetString(PyExc_ValueError, "nfc: tables of inconsistent sizes");
        goto done;
    }
    out = nfc_text(text, &t);
done:
    while (held-- > 0) PyBuffer_Release(&b[held]);
    return out;
}

/* json_marks(data) -> int: of a JSON record's bytes, 1 where it may hold a literal ("<" itself, or escaped
 * as \u003c / \u003C), 2 where it may spell a lone surrogate (a \ud / \uD escape): the substrings
 * `steps.sft` asked for in five passes over every line, found in one (memchr to each "<" and backslash). */
static PyObject *json_marks(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    const char *data = b.buf, *end = data + b.len;
    long marks = b.len && memchr(data, '<', (size_t)b.len) ? 1 : 0;
    for (const char *q = data; marks != 3 && q < end && (q = memchr(q, '\\', (size_t)(end - q))) != NULL; q++) {
        if (end - q < 3 || q[1] != 'u') continue;
        if (q[2] == 'd' || q[2] == 'D') marks |= 2;
        else if (end - q >= 6 && q[2] == '0' && q[3] == '0' && q[4] == '3' && (q[5] == 'c' || q[5] == 'C')) marks |= 1;
    }
    PyBuffer_Release(&b);
    return PyLong_FromLong(marks);
}

/* utf8(texts) -> list of bytes, or None where a text holds a lone surrogate: each str's UTF-8 (bytes kept), made by
 * `utf8_of` (ASCII runs 8 or 4 characters at a time), where the encoder's own request for it
 * (PyUnicode_AsUTF8AndSize, CPython's loop a character at a time) was ~6% of a pretraining worker's
 * instructions on 2-byte texts. */
static PyObject *utf8(PyObject *self, PyObject *texts) {
    if (!PyList_Check(texts)) {
        PyErr_SetString(PyExc_TypeError, "texts must be a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(texts), cap = 0;
    uint8_t *buf = NULL;
    PyObject *out = PyList_New(n);
    for (Py_ssize_t k = 0; out != NULL && k < n; k++) {
        PyObject *text = PyList_GET_ITEM(texts, k), *item = NULL;
        if (PyBytes_Check(text)) {  /* UTF-8 already */
            item = Py_NewRef(text);
        } else if (!PyUnicode_Check(text)) {
            PyErr_SetString(PyExc_TypeError, "texts must be str or bytes");
        } else if (PyUnicode_IS_ASCII(text)) {
            item = PyBytes_FromStringAndSize(PyUnicode_DATA(text), PyUnicode_GET_LENGTH(text));
        } else {
            Py_ssize_t size = utf8_of(text, &buf, &cap);
            if (size == -1) {  /* a lone surrogate: the caller keeps the str, whose encoding says why */
                Py_CLEAR(out);
                out = Py_NewRef(Py_None);
                break;
            }
            if (size >= 0) item = PyBytes_FromStringAndSize((const char *)buf, size);
        }
        if (item == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, k, item);
    }
    PyMem_Free(buf);
    return out;
}

/* json_texts(lines, keys) -> list: per jsonl line, the UTF-8 of its string values under `keys` (bytes, one
 * key; a tuple of them, several), read straight from the line, or None. Only a line that orjson and Python's
 * json would read as that very object gets its values: a JSON object by RFC 8259's grammar, valid UTF-8
 * throughout, no escape that spells a lone surrogate, nested at most JSON_DEPTH deep, each key of `keys`
 * there once (written without escapes, so that bytes compare as keys do) with a string value that is not
 * empty and not all whitespace (Python's str.isspace). Every other line is None, for the parsers to read
 * and to say what is wrong with it (`inputs.records`). Where orjson built each record's dict and str and
 * the str was made UTF-8 again for the encoder (~20% of a pretraining worker's CPU on never-repeating
 * text), this checks each byte once and copies the texts out. */
#define JSON_DEPTH 128

typedef struct {
    const uint8_t *p, *end;
    int escaped;  /* whether the string just read held an escape */
} Json;

static inline void json_ws(Json *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\r' || *j->p == '\n')) j->p++;
}

static inline int hex4(const uint8_t *p, Py_UCS4 *v) {
    Py_UCS4 x = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        x = x << 4 | (Py_UCS4)d;
    }
    *v = x;
    return 1;
}

/* The escape at p (after its backslash, bounds checked): its code point and its length past the backslash;
 * 0 where it is not a valid one or spells a lone surrogate (a pair is one code point). */
static inline int json_escape(const uint8_t *p, const uint8_t *end, Py_UCS4 *cp) {
    if (p >= end) return 0;
    switch (*p) {
    case '"': *cp = '"'; return 1;
    case '\\': *cp = '\\'; return 1;
    case '/': *cp = '/'; return 1;
    case 'b': *cp = '\b'; return 1;
    case 'f': *cp = '\f'; return 1;
    case 'n': *cp = '\n'; return 1;
    case 'r': *cp = '\r'; return 1;
    case 't': *cp = '\t'; return 1;
    case 'u': {
        Py_UCS4 hi, lo;
        if (end - p < 5 || !hex4(p + 1, &hi)) return 0;
        if (hi < 0xD800 || hi > 0xDFFF) {
            *cp = hi;
            return 5;
        }
        if (hi > 0xDBFF || end - p < 11 || p[5] != '\\' || p[6] != 'u' || !hex4(p + 7, &lo) || lo < 0xDC00 ||
            lo > 0xDFFF)
            return 0;
        *cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
        return 11;
    }
    }
    return 0;
}

/* A string from its opening quote: j->p past its closing quote, j->escaped set where it held an escape; 0
 * where it is not a valid one. Sixteen bytes a compare pass where none is a quote, a backslash, a control
 * character or non-ASCII. */
static int json_string(Json *j) {
    const uint8_t *p = j->p + 1, *end = j->end;
    j->escaped = 0;
    for (;;) {
#if defined(__SSE2__)
        const __m128i quote = _mm_set1_epi8('"'), slash = _mm_set1_epi8('\\'), space = _mm_set1_epi8(0x20);
        while (end - p >= 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)p);
            /* signed: below 0x20 is a control character or a byte of 0x80 and above */
            int m = _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, slash)),
                                                   _mm_cmplt_epi8(v, space)));
            if (m) {
                p += __builtin_ctz((unsigned)m);
                break;
            }
            p += 16;
        }
#endif
        if (p >= end) return 0;
        uint8_t c = *p;
        if (c == '"') {
            j->p = p + 1;
            return 1;
        }
        if (c == '\\') {
            Py_UCS4 cp;
            int n = json_escape(p + 1, end, &cp);
            if (!n) return 0;
            j->escaped = 1;
            p += 1 + n;
        } else if (c >= 0x80) {  /* a run of them (a word of most scripts) checked here in one go */
            do {
                Py_UCS4 cp;
                int n = utf8_at(p, end, &cp);
                if (!n) return 0;
                p += n;
            } while (p < end && *p >= 0x80);
        } else if (c < 0x20) {
            return 0;
        } else {
            p++;
        }
    }
}

static int json_value(Json *j, int depth);

static int json_number(Json *j) {
    const uint8_t *p = j->p, *end = j->end;
    if (p < end && *p == '-') p++;
    if (p >= end) return 0;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') p++;
    } else {
        return 0;
    }
    if (p < end && *p == '.') {
        const uint8_t *digits = ++p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        if (p == digits) return 0;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        const uint8_t *digits = p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        if (p == digits) return 0;
    }
    j->p = p;
    return 1;
}

static int json_literal(Json *j, const char *word, size_t n) {
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n)) return 0;
    j->p += n;
    return 1;
}

/* An array or object from its bracket, j->p past its end; 0 where it is not a valid one. */
static int json_container(Json *j, int depth) {
    uint8_t close = *j->p == '{' ? '}' : ']';
    if (depth > JSON_DEPTH) return 0;
    j->p++;
    json_ws(j);
    if (j->p < j->end && *j->p == close) {
        j->p++;
        return 1;
    }
    for (;;) {
        if (close == '}') {
            if (j->p >= j->end || *j->p != '"' || !json_string(j)) return 0;
            json_ws(j);
            if (j->p >= j->end || *j->p != ':') return 0;
            j->p++;
            json_ws(j);
        }
        if (!json_value(j, depth + 1)) return 0;
        json_ws(j);
        if (j->p >= j->end) return 0;
        if (*j->p == close) {
            j->p++;
            return 1;
        }
        if (*j->p != ',') return 0;
        j->p++;
        json_ws(j);
    }
}

static int json_value(Json *j, int depth) {
    if (j->p >= j->end) return 0;
    switch (*j->p) {
    case '"': return json_string(j);
    case '{': case '[': return json_container(j, depth);
    case 't': return json_literal(j, "true", 4);
    case 'f': return json_literal(j, "false", 5);
    case 'n': return json_literal(j, "null", 4);
    default: return json_number(j);
    }
}

/* The string value between `begin` (past its quote) and `end` (its closing quote), valid (`json_string`), as
 * bytes: its escapes written out as UTF-8; None where it is empty or all whitespace as str.isspace sees it. */
static PyObject *json_text(const uint8_t *begin, const uint8_t *end, int escaped) {
    const uint8_t *p = begin;
    for (;;) {  /* the leading whitespace: a text of nothing else is left to the parsers */
        Py_UCS4 cp = 0;
        int n = 1;
        if (p >= end) Py_RETURN_NONE;
        if (*p == '\\') n = 1 + json_escape(p + 1, end, &cp);
        else if (*p >= 0x80) n = utf8_at(p, end, &cp);
        else cp = *p;
        if (!Py_UNICODE_ISSPACE(cp)) break;
        p += n;
    }
    if (!escaped) return PyBytes_FromStringAndSize((const char *)begin, end - begin);
    PyObject *out = PyBytes_FromStringAndSize(NULL, end - begin);  /* an escape is never shorter written out */
    if (out == NULL) return NULL;
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    for (p = begin; p < end;) {
        const uint8_t *slash = memchr(p, '\\', (size_t)(end - p));
        if (slash == NULL) slash = end;
        memcpy(o, p, (size_t)(slash - p));
        o += slash - p;
        if (slash == end) break;
        Py_UCS4 cp = 0;
        int n = json_escape(slash + 1, end, &cp);
        o = put_utf8(o, cp);
        p = slash + 1 + n;
    }
    if (_PyBytes_Resize(&out, (Py_ssize_t)(o - (uint8_t *)PyBytes_AS_STRING(out))) < 0) return NULL;
    return out;
}

/* One line's values under the n keys into found[] (new references); 1 where the line gives them all, 0 where
 * it is left to the parsers, -1 on an error (set). */
static int json_line(const uint8_t *p, Py_ssize_t len, PyObject *keys, Py_ssize_t n, PyObject **found) {
    Json j = {p, p + len, 0};
    json_ws(&j);
    if (j.p >= j.end || *j.p != '{') return 0;
    j.p++;
    json_ws(&j);
    while (j.p < j.end && *j.p == '"') {
        const uint8_t *key = j.p + 1;
        if (!json_string(&j)) return 0;
        Py_ssize_t key_len = j.p - 1 - key, k = -1;
        if (j.escaped) return 0;  /* "te\u0078t" is "text": left to the parsers, which read the escape */
        for (Py_ssize_t i = 0; i < n && k < 0; i++) {
            PyObject *want = PyTuple_GET_ITEM(keys, i);
            if (PyBytes_GET_SIZE(want) == key_len && !memcmp(PyBytes_AS_STRING(want), key, (size_t)key_len)) k = i;
        }
        json_ws(&j);
        if (j.p >= j.end || *j.p != ':') return 0;
        j.p++;
        json_ws(&j);
        if (k >= 0) {  /* a key asked for: once, and a string */
            if (found[k] != NULL || j.p >= j.end || *j.p != '"') return 0;
            const uint8_t *begin = j.p + 1;
            if (!json_string(&j)) return 0;
            found[k] = json_text(begin, j.p - 1, j.escaped);
            if (found[k] == NULL) return PyErr_Occurred() ? -1 : 0;
            if (found[k] == Py_None) {
                Py_CLEAR(found[k]);
                return 0;
            }
        } else if (!json_value(&j, 1)) {
            return 0;
        }
        json_ws(&j);
        if (j.p < j.end && *j.p == ',') {
            j.p++;
            json_ws(&j);
            if (j.p >= j.end || *j.p != '"') return 0;
            continue;
        }
        break;
    }
    if (j.p >= j.end || *j.p != '}') return 0;
    j.p++;
    json_ws(&j);
    if (j.p != j.end) return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (found[i] == NULL) return 0;
    return 1;
}

static PyObject *json_texts(PyObject *self, PyObject *args) {
    PyObject *lines, *keys;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &lines, &PyTuple_Type, &keys)) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(keys);
    if (n < 1 || n > 64) {
        PyErr_SetString(PyExc_ValueError, "keys: 1 to 64 expected");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(keys, i))) {
            PyErr_SetString(PyExc_TypeError, "keys must be bytes");
            return NULL;
        }
    PyObject *found[64], *out = PyList_New(PyList_GET_SIZE(lines));
    for (Py_ssize_t k = 0; out != NULL && k < PyList_GET_SIZE(lines); k++) {
        PyObject *line = PyList_GET_ITEM(lines, k), *item = NULL;
        if (!PyBytes_Check(line)) {
            PyErr_SetString(PyExc_TypeError, "lines must be bytes");
            Py_CLEAR(out);
            break;
        }
        memset(found, 0, sizeof(PyObject *) * (size_t)n);
        int got = json_line((const uint8_t *)PyBytes_AS_STRING(line), PyBytes_GET_SIZE(line), keys, n, found);
        if (got == 1 && n == 1) {
            item = found[0];
            found[0] = NULL;
        } else if (got == 1) {
            item = PyTuple_New(n);
            for (Py_ssize_t i = 0; item != NULL && i < n; i++) {
                PyTuple_SET_ITEM(item, i, found[i]);
                found[i] = NULL;
            }
        } else if (got == 0) {
            item = Py_NewRef(Py_None);
        }
        for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(found[i]);
        if (item == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, k, item);
    }
    return out;
}

/* newlines(fd, start, stop) -> int: the newlines in bytes [start, stop) of the file `fd` (fewer where it ends
 * before `stop`), read a MiB at a time into one buffer and counted sixteen bytes a compare, the GIL let go (mapping the
 * file instead was no faster: its page faults cost what the copy does). A
 * shard's first line number is the newlines before it: Python's reads and bytes.count took ~0.65 s a GB
 * (new 16 MiB objects, each page of them faulted in; this: ~0.26), which the last of 16 Ray shards of 8 GB paid. */
#define NEWLINES_BLOCK (1 << 20)

static int64_t count_newlines(const uint8_t *p, Py_ssize_t n) {
    int64_t found = 0;
    Py_ssize_t i = 0;
#if defined(__SSE2__)
    const __m128i nl = _mm_set1_epi8('\n');
    for (; i + 16 <= n; i += 16)
        found += __builtin_popcount((unsigned)_mm_movemask_epi8(
            _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(p + i)), nl)));
#endif
    for (; i < n; i++) found += p[i] == '\n';
    return found;
}

static PyObject *newlines(PyObject *self, PyObject *args) {
    int fd;
    long long start, stop;
    if (!PyArg_ParseTuple(args, "iLL", &fd, &start, &stop)) return NULL;
    uint8_t *buf = PyMem_RawMalloc(NEWLINES_BLOCK);
    if (buf == NULL) return PyErr_NoMemory();
    int64_t found = 0;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    while (start < stop) {
        size_t want = (size_t)(stop - start < NEWLINES_BLOCK ? stop - start : NEWLINES_BLOCK);
        ssize_t got = pread(fd, buf, want, (off_t)start);
        if (got < 0) {
            failed = 1;
            break;
        }
        if (got == 0) break;  /* the file ends first */
        found += count_newlines(buf, got);
        start += got;
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(buf);
    if (failed) return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLongLong(found);
}

/* lines(data) -> list of bytes: data.split(b"\n"), each newline found by memchr (vector compares), where
 * CPython's split tests byte by byte: ~5 instructions a byte, ~4% of a pretraining worker's. */
static PyObject *lines(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    const char *data = b.buf, *end = data + b.len, *at = data, *nl;
    PyObject *out = PyList_New(0);
    while (out != NULL) {
        nl = at < end ? memchr(at, '\n', (size_t)(end - at)) : NULL;
        PyObject *line = PyBytes_FromStringAndSize(at, (nl ? nl : end) - at);
        if (line == NULL || PyList_Append(out, line) < 0) Py_CLEAR(out);
        Py_XDECREF(line);
        if (nl == NULL) break;
        at = nl + 1;
    }
    PyBuffer_Release(&b);
    return out;
}

/* rows_marked(ids, lengths, marked) -> bytes: the rows (texts of lengths[k] ids each, back to back in
 * ids, int32) holding an id whose byte in `marked` (uint8, one an id) is set, as int64 row numbers:
 * the texts gigatoken may encode unlike HF (`QwenTokenizer.exact_rows`), found in one pass over the
 * ids, where numpy's gather of a flag per id made an index array of 8 bytes an id first. */
static PyObject *rows_marked(PyObject *self, PyObject *args) {
    PyObject *ids_obj, *lengths_obj, *marked_obj;
    if (!PyArg_ParseTuple(args, "OOO", &ids_obj, &lengths_obj, &marked_obj)) return NULL;
    Py_buffer ids_b, lengths_b, marked_b;
    PyObject *out = NULL;
    if (view(ids_obj, &ids_b, 4, "ids") < 0) return NULL;
    if (view(lengths_obj, &lengths_b, 8, "lengths") < 0) goto ids;
    if (view(marked_obj, &marked_b, 1, "marked") < 0) goto lengths;
    const int32_t *ids = ids_b.buf;
    const int64_t *lengths = lengths_b.buf;
    const uint8_t *marked = marked_b.buf;
    Py_ssize_t n_ids = ids_b.len / 4, rows = lengths_b.len / 8, n_marked = marked_b.len, at = 0, found = 0;
    int64_t *hits = PyMem_Malloc((rows ? rows : 1) * sizeof(int64_t));
    if (hits == NULL) {
        PyErr_NoMemory();
        goto marked;
    }
    for (Py_ssize_t r = 0; r < rows; r++) {
        if (lengths[r] < 0 || lengths[r] > n_ids - at) {
            PyErr_SetString(PyExc_ValueError, "lengths: more ids than there are");
            goto hits;
        }
        uint8_t any = 0;
        for (Py_ssize_t end = at + lengths[r]; at < end; at++) {
            if ((uint32_t)ids[at] >= (uint32_t)n_marked) {
                PyErr_Format(PyExc_ValueError, "id %d outside the table of %zd", ids[at], n_marked);
                goto hits;
            }
            any |= marked[ids[at]];
        }
        if (any) hits[found++] = r;
    }
    out = PyBytes_FromStringAndSize((const char *)hits, found * (Py_ssize_t)sizeof(int64_t));
hits:
    PyMem_Free(hits);
marked:
    PyBuffer_Release(&marked_b);
lengths:
    PyBuffer_Release(&lengths_b);
ids:
    PyBuffer_Release(&ids_b);
    return out;
}

/* The certificate's pick of a record: CRC-32 (zlib's, from a seed) of its key, xor the seed, spread by
 * MurmurHash3's 32-bit finalizer (`certify.sample.record_hash` defines it in Python). In Python each
 * record cost a worker ~1.5-3 us (its key cut and joined, the finalizer in Python ints) of ~70-120 us
 * of tokenizing: most of what picking added. Slicing-by-8 tables, made as the module loads. */
static uint32_t CRC[8][256];

static void make_crc(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        CRC[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 1; k < 8; k++) CRC[k][n] = (CRC[k - 1][n] >> 8) ^ CRC[0][CRC[k - 1][n] & 0xFF];
}

static uint32_t crc32_on(uint32_t crc, const uint8_t *p, Py_ssize_t n) {  /* zlib.crc32(p[:n], crc) */
    crc = ~crc;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = CRC[7][w & 0xFF] ^ CRC[6][(w >> 8) & 0xFF] ^ CRC[5][(w >> 16) & 0xFF] ^ CRC[4][(w >> 24) & 0xFF] ^
              CRC[3][(w >> 32) & 0xFF] ^ CRC[2][(w >> 40) & 0xFF] ^ CRC[1][(w >> 48) & 0xFF] ^ CRC[0][w >> 56];
    }
#endif
    for (; n > 0; p++, n--) crc = CRC[0][(crc ^ *p) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

static PyObject *key_hashes(PyObject *self, PyObject *args) {
    PyObject *items;
    unsigned long long seed_in;
    Py_ssize_t cut;  /* a line: past 2 * cut bytes, its first and last `cut` and its length; 0: as it is */
    if (!PyArg_ParseTuple(args, "O!Kn", &PyList_Type, &items, &seed_in, &cut)) return NULL;
    if (seed_in > 0xFFFFFFFFull || cut < 0) {
        PyErr_SetString(PyExc_ValueError, "the seed is 32 bits, the cut not negative");
        return NULL;
    }
    uint32_t seed = (uint32_t)seed_in;
    Py_ssize_t n = PyList_GET_SIZE(items);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 4);
    if (out == NULL) return NULL;
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (!PyBytes_Check(item)) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_TypeError, "keys must be bytes");
            return NULL;
        }
        const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(item);
        Py_ssize_t size = PyBytes_GET_SIZE(item);
        uint32_t h;
        if (cut == 0 || size <= 2 * cut) {
            h = crc32_on(seed, p, size);
        } else {
            uint8_t length[8];
            for (int k = 0; k < 8; k++) length[k] = (uint8_t)((uint64_t)size >> (8 * k));
            h = crc32_on(crc32_on(crc32_on(seed, p, cut), p + size - cut, cut), length, 8);
        }
        h ^= seed;
        h = (h ^ (h >> 16)) * 0x85EBCA6Bu;
        h = (h ^ (h >> 13)) * 0xC2B2AE35u;
        h ^= h >> 16;
        for (int k = 0; k < 4; k++) o[4 * i + k] = (uint8_t)(h >> (8 * k));  /* little-endian */
    }
    return out;
}

static PyMethodDef methods[] = {
    {"best_fit_rows", best_fit_rows, METH_VARARGS, "Best fit decreasing: each sorted sample's row; the rows."},
    {"pack_rows", pack_rows, METH_VARARGS, "Packed rows laid out from their samples and plan."},
    {"misspelled", misspelled, METH_VARARGS, "The first text whose ids do not spell it, or -1."},
    {"structure_mask", structure_mask, METH_VARARGS, "The loss mask the samples' ChatML structure gives."},
    {"poly", poly, METH_VARARGS, "The .bin hash (h1, h2) going on over data."},
    {"poly_each", poly_each, METH_VARARGS, "The hash of each piece of data, (h1, h2) pairs as bytes."},
    {"rows_marked", rows_marked, METH_VARARGS, "The rows holding an id marked in a table, as int64."},
    {"poly_path", poly_path, METH_VARARGS, "The hash's block loop, after switching to the one named."},
    {"poly_join", poly_join, METH_VARARGS, "The hash (h1, h2) going on over pieces of known hashes."},
    {"nfc_suspects", nfc_suspects, METH_VARARGS, "The texts that may not be in NFC, by index."},
    {"nfc", nfc, METH_VARARGS, "The text in NFC by the tables given; None where it holds a surrogate."},
    {"nfc_unsettled", nfc_unsettled, METH_VARARGS, "Of the suspects, those a finer check leaves unproven."},
    {"utf8", utf8, METH_O, "Each str's UTF-8 as bytes; None where one holds a lone surrogate."},
    {"lines", lines, METH_O, "data.split(b'\\n'), by memchr."},
    {"newlines", newlines, METH_VARARGS, "The newlines in bytes [start, stop) of a file descriptor."},
    {"json_texts", json_texts, METH_VARARGS, "Per jsonl line, its string values under keys as UTF-8, or None."},
    {"key_hashes", key_hashes, METH_VARARGS, "Each record's pick hash (certify.sample), as little-endian uint32."},
    {"json_marks", json_marks, METH_O, "1: a JSON record may hold a literal; 2: it may spell a lone surrogate."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    make_crc();
    make_terms();
    make_block_limbs();
    choose_path();
    return PyModule_Create(&module);
}
