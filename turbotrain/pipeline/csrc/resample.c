/* Separable resampling (see resample.h). The vertical pass runs first, over whole rows of the
 * crop: it is a weighted sum of contiguous bytes, which the compiler vectorises (the target
 * clones below pick AVX2 where the CPU has it). The horizontal pass, which gathers three
 * channels per tap and does not vectorise, then only runs over the out_h rows it produced: for a
 * 340x300 crop going to 224x224 that is 224 rows of gathers instead of 340.
 *
 * Fixed point: weights sum to 1 << 14. The vertical pass keeps 8 fractional bits in uint16
 * (255 << 8 at most), the horizontal one rounds once at the end: (sum + 2^21) >> 22. Sums stay
 * below 2^31 (65,280 * 16,384 + 2^21), weights are never negative, so nothing needs clamping. */
#include "resample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define WEIGHT_BITS 14
#define WEIGHT_ONE (1 << WEIGHT_BITS)
#define MID_SHIFT 6                           /* 14 - 8 fractional bits kept in uint16 */
#define OUT_SHIFT (WEIGHT_BITS + 8)

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
    free(r->mid);
    free(r->acc);
    memset(r, 0, sizeof(*r));
}

static int axis_alloc(tt_axis *a, int out, int max_taps) {
    axis_free(a);
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

static void horizontal_two(const uint16_t *mid, const tt_axis *cols, uint8_t *dst, int flip) {
    int out = cols->out;
    const int16_t *w = cols->weight;
    uint8_t *o = flip ? dst + 3 * (out - 1) : dst;
    int step = flip ? -3 : 3;
    for (int d = 0; d < out; d++, w += 2, o += step) {
        const uint16_t *p = mid + 3 * cols->start[d];
        int32_t w0 = w[0], w1 = w[1];
        o[0] = (uint8_t)((w0 * p[0] + w1 * p[3] + (1 << (OUT_SHIFT - 1))) >> OUT_SHIFT);
        o[1] = (uint8_t)((w0 * p[1] + w1 * p[4] + (1 << (OUT_SHIFT - 1))) >> OUT_SHIFT);
        o[2] = (uint8_t)((w0 * p[2] + w1 * p[5] + (1 << (OUT_SHIFT - 1))) >> OUT_SHIFT);
    }
}

static void horizontal_many(const uint16_t *mid, const tt_axis *cols, uint8_t *dst, int flip) {
    int out = cols->out, taps = cols->max_taps;
    uint8_t *o = flip ? dst + 3 * (out - 1) : dst;
    int step = flip ? -3 : 3;
    for (int d = 0; d < out; d++, o += step) {
        const uint16_t *p = mid + 3 * cols->start[d];
        const int16_t *w = cols->weight + (size_t)d * taps;
        int32_t r = 1 << (OUT_SHIFT - 1), g = r, b = r;
        for (int t = 0; t < cols->count[d]; t++, p += 3) {
            r += w[t] * p[0];
            g += w[t] * p[1];
            b += w[t] * p[2];
        }
        o[0] = (uint8_t)(r >> OUT_SHIFT);
        o[1] = (uint8_t)(g >> OUT_SHIFT);
        o[2] = (uint8_t)(b >> OUT_SHIFT);
    }
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
    if (grow((void **)&r->mid, &r->mid_len, (size_t)out_h * len, sizeof(uint16_t)) ||
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
    size_t out_stride = (size_t)out_w * 3;
    for (int y = 0; y < out_h; y++) {
        const uint16_t *mid = r->mid + (size_t)y * len;
        if (!area && r->cols.max_taps == 2)
            horizontal_two(mid, &r->cols, dst + y * out_stride, flip);
        else
            horizontal_many(mid, &r->cols, dst + y * out_stride, flip);
    }
    return 0;
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
