/* Separable resampling (see resample.h). The vertical pass runs first, over whole rows of the
 * crop: it is a weighted sum of contiguous bytes, which the compiler vectorises (the target
 * clones below pick AVX2 where the CPU has it). The horizontal pass then only runs over the
 * out_h rows it produced (for a 340x300 crop going to 224x224: 224 rows instead of 340), and is
 * vectorised by hand with SSSE3: one 16-byte load holds two adjacent RGB pixels of the
 * intermediate row, a byte shuffle pairs their channels, (R0 R1 G0 G1 B0 B1 . .), and pmaddwd
 * applies two taps to three channels in one instruction; the linear filter does two pixels per
 * AVX2 instruction. 300x340 -> 224: 3.7 M instructions scalar, 1.1 M vectorised (callgrind),
 * about cv2's bilinear in wall time (bench/bench_kernel.py's stages time it in the pipeline).
 *
 * Fixed point: weights sum to 1 << 14. The vertical pass keeps 7 fractional bits in the uint16
 * intermediate (255 << 7 = 32,640 at most, so pmaddwd's signed 16-bit inputs hold it); the
 * horizontal pass rounds once at the end: (sum + 2^20) >> 21. Sums stay below 2^31
 * (32,640 * 16,384 + 2^20), weights are never negative, so nothing needs clamping. The scalar
 * path (no SSSE3) does the same integer arithmetic and gives the same bytes. */
#include "resample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && !defined(TT_SCALAR)  /* TT_SCALAR: tests */
#include <immintrin.h>
#define TT_X86 1
#endif

#define WEIGHT_BITS 14
#define WEIGHT_ONE (1 << WEIGHT_BITS)
#define MID_BITS 7                            /* fractional bits kept in the uint16 rows */
#define MID_SHIFT (WEIGHT_BITS - MID_BITS)
#define OUT_SHIFT (WEIGHT_BITS + MID_BITS)
/* The SIMD loads read up to 16 bytes from a tap pair's first pixel: slack after the rows. */
#define MID_SLACK 16

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define TT_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TT_CLONES
#endif

static int grow(void **buffer, size_t *len, size_t need, size_t item) {
    if (need <= *len) return 0;
    void *bigger = realloc(*buffer, need * item);
    if (!bigger) return -1;
    *buffer = bigger;
    *len = need;
    return 0;
}

static void axis_free(tt_axis *a) {
    free(a->start);
    free(a->count);
    free(a->weight);
    memset(a, 0, sizeof(*a));
}

void tt_resampler_free(tt_resampler *r) {
    axis_free(&r->rows);
    axis_free(&r->cols);
    free(r->plan.offset);
    free(r->plan.pairs);
    free(r->plan.weights);
    free(r->mid);
    free(r->acc);
    memset(r, 0, sizeof(*r));
}

static int axis_alloc(tt_axis *a, int out, int max_taps) {
    axis_free(a);
    max_taps += max_taps & 1;  /* the SIMD pass reads taps in pairs; the spare weight is 0 */
    a->out = out;
    a->max_taps = max_taps;
    a->start = malloc(sizeof(int) * out);
    a->count = malloc(sizeof(int) * out);
    a->weight = calloc((size_t)out * max_taps, sizeof(int16_t));
    return (a->start && a->count && a->weight) ? 0 : -1;
}

/* Rounds output d's float weights to fixed point summing to exactly WEIGHT_ONE (the rounding
 * error goes to the largest weight, so a flat image stays flat). */
static void quantise(tt_axis *a, int d, const double *w, int n) {
    int16_t *q = a->weight + (size_t)d * a->max_taps;
    int sum = 0, largest = 0;
    for (int t = 0; t < n; t++) {
        q[t] = (int16_t)lrint(w[t] * WEIGHT_ONE);
        sum += q[t];
        if (q[t] > q[largest]) largest = t;
    }
    q[largest] += WEIGHT_ONE - sum;
    a->count[d] = n;
}

/* cv2 INTER_LINEAR: x_in = (d + 0.5) * scale - 0.5, two taps, clamped at the edges. Every
 * output gets exactly two taps when in >= 2 (an edge's second weight is 0), so the inner loops
 * have a fixed trip count. */
static int plan_linear(tt_axis *a, int in, int out) {
    int taps = in >= 2 ? 2 : 1;
    if (axis_alloc(a, out, taps)) return -1;
    double scale = (double)in / out;
    for (int d = 0; d < out; d++) {
        double x = (d + 0.5) * scale - 0.5;
        int s = (int)floor(x);
        double f = x - s;
        if (s < 0) { s = 0; f = 0; }
        if (s >= in - 1) { s = in - 1; f = 0; }
        double w[2] = {1.0 - f, f};
        if (taps == 1) {
            a->start[d] = 0;
            quantise(a, d, w, 1);
        } else if (s == in - 1) {           /* right edge: read (in-2, in-1) with weights (0, 1) */
            double edge[2] = {0.0, 1.0};
            a->start[d] = in - 2;
            quantise(a, d, edge, 2);
        } else {
            a->start[d] = s;
            quantise(a, d, w, 2);
        }
    }
    return 0;
}

/* cv2 INTER_AREA (computeResizeAreaTab): output d averages the input span
 * [d * scale, (d + 1) * scale), each input pixel weighted by its overlap with the span. */
static int plan_area(tt_axis *a, int in, int out) {
    double scale = (double)in / out;
    int max_taps = (int)ceil(scale) + 2;
    if (axis_alloc(a, out, max_taps)) return -1;
    double *w = malloc(sizeof(double) * max_taps);
    if (!w) return -1;
    for (int d = 0; d < out; d++) {
        double f1 = d * scale, f2 = f1 + scale;
        double cell = fmin(scale, in - f1);
        int s1 = (int)ceil(f1), s2 = (int)floor(f2);
        if (s2 > in - 1) s2 = in - 1;
        if (s1 > s2) s1 = s2;
        int n = 0, first = s1;
        if (s1 - f1 > 1e-3) { first = s1 - 1; w[n++] = (s1 - f1) / cell; }
        for (int s = s1; s < s2; s++) w[n++] = 1.0 / cell;
        if (f2 - s2 > 1e-3) w[n++] = fmin(fmin(f2 - s2, 1.0), cell) / cell;
        if (n == 0) w[n++] = 1.0;       /* a span narrower than the 1e-3 slack: its pixel */
        a->start[d] = first;
        quantise(a, d, w, n);
    }
    free(w);
    return 0;
}

TT_CLONES
static void vertical_two(const uint8_t *r0, const uint8_t *r1, int w0, int w1, uint16_t *mid,
                         int len) {
    for (int j = 0; j < len; j++)
        mid[j] = (uint16_t)((w0 * r0[j] + w1 * r1[j] + (1 << (MID_SHIFT - 1))) >> MID_SHIFT);
}

TT_CLONES
static void vertical_many(const uint8_t *row, size_t stride, const int16_t *w, int n,
                          int32_t *acc, uint16_t *mid, int len) {
    for (int j = 0; j < len; j++) acc[j] = w[0] * row[j];
    for (int t = 1; t < n; t++) {
        row += stride;
        int wt = w[t];
        for (int j = 0; j < len; j++) acc[j] += wt * row[j];
    }
    for (int j = 0; j < len; j++)
        mid[j] = (uint16_t)((acc[j] + (1 << (MID_SHIFT - 1))) >> MID_SHIFT);
}

/* Output position q of a row takes input d = q, or out - 1 - q when flipped; positions are
 * written in increasing order, so a 4-byte store may spill into the next, not yet written one. */
static void horizontal_scalar(const uint16_t *mid, const tt_axis *cols, uint8_t *dst,
                              int flip) {
    int out = cols->out, taps = cols->max_taps;
    for (int q = 0; q < out; q++) {
        int d = flip ? out - 1 - q : q;
        const uint16_t *p = mid + 3 * cols->start[d];
        const int16_t *w = cols->weight + (size_t)d * taps;
        int32_t r = 1 << (OUT_SHIFT - 1), g = r, b = r;
        for (int t = 0; t < cols->count[d]; t++, p += 3) {
            r += w[t] * p[0];
            g += w[t] * p[1];
            b += w[t] * p[2];
        }
        uint8_t *o = dst + 3 * q;
        o[0] = (uint8_t)(r >> OUT_SHIFT);
        o[1] = (uint8_t)(g >> OUT_SHIFT);
        o[2] = (uint8_t)(b >> OUT_SHIFT);
    }
}

#ifdef TT_X86
/* One output pixel: for each pair of taps (t, t + 1), the 16 bytes at pixel start + t are
 * (R0 G0 B0 R1 G1 B1 R2 G2) as int16; the shuffle makes (R0 R1 G0 G1 B0 B1 0 0) and pmaddwd
 * with (w_t w_t+1) x 3 gives the three channels' partial sums. An odd tap count's last pair has
 * a zero second weight (quantise leaves the unused weights 0). */
/* One output pixel: for each pair of taps (t, t + 1), the 16 bytes at pixel start + t are
 * (R0 G0 B0 R1 G1 B1 R2 G2) as int16; the shuffle makes (R0 R1 G0 G1 B0 B1 0 0) and pmaddwd
 * with (w_t w_t+1) x 3 gives the three channels' partial sums. An odd tap count's last pair has
 * a zero second weight (quantise leaves the unused weights 0). 12 instructions a pixel for the
 * linear filter's single pair, against ~40 scalar. */
__attribute__((target("ssse3")))
static void horizontal_ssse3(const uint16_t *mid, const tt_row_plan *plan, int out,
                             uint8_t *dst) {
    const __m128i pair = _mm_setr_epi8(0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11, -1, -1, -1, -1);
    const __m128i round = _mm_set1_epi32(1 << (OUT_SHIFT - 1));
    const int32_t *offset = plan->offset, *pairs = plan->pairs;
    const uint32_t *weights = plan->weights;
    int stride = plan->max_pairs;
    for (int q = 0; q < out; q++, weights += stride) {
        const uint16_t *p = mid + offset[q];
        __m128i sum = round;
        for (int k = 0; k < pairs[q]; k++, p += 6) {
            __m128i pixels = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)p), pair);
            sum = _mm_add_epi32(sum, _mm_madd_epi16(pixels, _mm_set1_epi32((int)weights[k])));
        }
        __m128i bytes = _mm_srai_epi32(sum, OUT_SHIFT);
        bytes = _mm_packus_epi16(_mm_packs_epi32(bytes, bytes), bytes);
        uint32_t rgbx = (uint32_t)_mm_cvtsi128_si32(bytes);  /* R G B 0 */
        if (q + 1 < out) memcpy(dst + 3 * q, &rgbx, 4);  /* the 4th byte: the next pixel's */
        else memcpy(dst + 3 * q, &rgbx, 3);
    }
}

/* The linear filter: one tap pair per pixel, two pixels per AVX2 instruction (each 128-bit lane
 * is horizontal_ssse3's register for one pixel). ~7 instructions a pixel. */
__attribute__((target("avx2")))
static void horizontal_linear_avx2(const uint16_t *mid, const tt_row_plan *plan, int out,
                                   uint8_t *dst) {
    const __m256i pair = _mm256_setr_epi8(0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11, -1, -1, -1, -1,
                                          0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11, -1, -1, -1, -1);
    const __m256i round = _mm256_set1_epi32(1 << (OUT_SHIFT - 1));
    const int32_t *offset = plan->offset;
    const int32_t *weights = (const int32_t *)plan->weights;
    int q = 0;
    for (; q + 2 < out; q += 2) {  /* stops with >= 1 pixel left: the last is stored as 3 bytes */
        __m128i a = _mm_loadu_si128((const __m128i *)(mid + offset[q]));
        __m128i b = _mm_loadu_si128((const __m128i *)(mid + offset[q + 1]));
        __m256i pixels = _mm256_shuffle_epi8(
            _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1), pair);
        __m256i w = _mm256_inserti128_si256(_mm256_set1_epi32(weights[q]),
                                            _mm_set1_epi32(weights[q + 1]), 1);
        __m256i sum = _mm256_srai_epi32(_mm256_add_epi32(_mm256_madd_epi16(pixels, w), round),
                                        OUT_SHIFT);
        __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(sum, sum), sum);
        uint32_t first = (uint32_t)_mm256_extract_epi32(bytes, 0);
        uint32_t second = (uint32_t)_mm256_extract_epi32(bytes, 4);
        memcpy(dst + 3 * q, &first, 4);       /* 4th bytes: overwritten by the next pixel */
        memcpy(dst + 3 * q + 3, &second, 4);
    }
    tt_row_plan rest = *plan;
    rest.offset += q;
    rest.pairs += q;
    rest.weights += q;
    horizontal_ssse3(mid, &rest, out - q, dst + 3 * q);
}

static int have_avx2(void) {
    static int known = -1;
    if (known < 0) known = __builtin_cpu_supports("avx2") ? 1 : 0;
    return known;
}

/* The plan for `cols` (flip applied), built once per resize. */
static int plan_rows(tt_row_plan *plan, const tt_axis *cols, int flip) {
    int out = cols->out, max_pairs = cols->max_taps / 2;
    if ((size_t)out > plan->len || max_pairs > plan->max_pairs) {
        free(plan->offset);
        free(plan->pairs);
        free(plan->weights);
        plan->offset = malloc(sizeof(int32_t) * out);
        plan->pairs = malloc(sizeof(int32_t) * out);
        plan->weights = malloc(sizeof(uint32_t) * out * max_pairs);
        plan->len = plan->offset && plan->pairs && plan->weights ? (size_t)out : 0;
        if (!plan->len) return -1;
    }
    plan->max_pairs = max_pairs;
    for (int q = 0; q < out; q++) {
        int d = flip ? out - 1 - q : q;
        const int16_t *w = cols->weight + (size_t)d * cols->max_taps;
        plan->offset[q] = 3 * cols->start[d];
        plan->pairs[q] = (cols->count[d] + 1) / 2;
        for (int k = 0; k < max_pairs; k++)
            plan->weights[(size_t)q * max_pairs + k] =
                (uint16_t)w[2 * k] | (uint32_t)(uint16_t)w[2 * k + 1] << 16;
    }
    return 0;
}

static int have_ssse3(void) {
    static int known = -1;
    if (known < 0) known = __builtin_cpu_supports("ssse3") ? 1 : 0;
    return known;
}
#endif

/* The horizontal pass over out_h intermediate rows of `len` uint16 each. */
static int horizontal(tt_resampler *r, int out_h, size_t len, uint8_t *dst, int flip) {
    size_t out_stride = (size_t)r->cols.out * 3;
#ifdef TT_X86
    if (have_ssse3()) {
        if (plan_rows(&r->plan, &r->cols, flip)) return -1;
        int linear = r->plan.max_pairs == 1 && have_avx2();
        for (int y = 0; y < out_h; y++) {
            if (linear)
                horizontal_linear_avx2(r->mid + y * len, &r->plan, r->cols.out,
                                       dst + y * out_stride);
            else
                horizontal_ssse3(r->mid + y * len, &r->plan, r->cols.out, dst + y * out_stride);
        }
        return 0;
    }
#endif
    for (int y = 0; y < out_h; y++)
        horizontal_scalar(r->mid + y * len, &r->cols, dst + y * out_stride, flip);
    return 0;
}

int tt_resize(tt_resampler *r, const uint8_t *src, size_t src_stride, int in_h, int in_w,
              uint8_t *dst, int out_h, int out_w, int flip) {
    if (in_h == out_h && in_w == out_w) {
        tt_copy(src, src_stride, dst, out_h, out_w, flip);
        return 0;
    }
    double shrink = fmin((double)in_h / out_h, (double)in_w / out_w);
    int area = shrink >= 2.0;
    if ((area ? plan_area(&r->rows, in_h, out_h) : plan_linear(&r->rows, in_h, out_h)) ||
        (area ? plan_area(&r->cols, in_w, out_w) : plan_linear(&r->cols, in_w, out_w)))
        return -1;
    int len = in_w * 3;
    if (grow((void **)&r->mid, &r->mid_len, (size_t)out_h * len + MID_SLACK, sizeof(uint16_t)) ||
        grow((void **)&r->acc, &r->acc_len, (size_t)len, sizeof(int32_t)))
        return -1;
    const tt_axis *rows = &r->rows;
    for (int y = 0; y < out_h; y++) {
        const int16_t *w = rows->weight + (size_t)y * rows->max_taps;
        const uint8_t *row = src + (size_t)rows->start[y] * src_stride;
        uint16_t *mid = r->mid + (size_t)y * len;
        if (rows->count[y] == 2)
            vertical_two(row, row + src_stride, w[0], w[1], mid, len);
        else
            vertical_many(row, src_stride, w, rows->count[y], r->acc, mid, len);
    }
    memset(r->mid + (size_t)out_h * len, 0, MID_SLACK * sizeof(uint16_t));
    return horizontal(r, out_h, (size_t)len, dst, flip);
}

void tt_copy(const uint8_t *src, size_t src_stride, uint8_t *dst, int out_h, int out_w,
             int flip) {
    size_t row = (size_t)out_w * 3;
    for (int y = 0; y < out_h; y++, src += src_stride, dst += row) {
        if (!flip) {
            memcpy(dst, src, row);
            continue;
        }
        for (int x = 0; x < out_w; x++)
            memcpy(dst + 3 * (out_w - 1 - x), src + 3 * x, 3);
    }
}
