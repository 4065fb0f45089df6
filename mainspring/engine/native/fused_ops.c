/* Fused fp32 row ops for the few-row steps of a decode (engine/native_ops.py builds and loads this file).
 *
 * Each function reads and writes contiguous [rows, d] fp32 buffers and touches nothing else: no allocation,
 * no threads, no global state. Plain C loops the compiler vectorizes; only the flags differ between CPUs
 * (native_ops.variant): with -mavx2 -mfma on x86 CPUs that have both, the loops become 8-wide AVX2 with fused
 * multiply-adds (the same instructions hand-written intrinsics gave: checked with -fopt-info-vec and objdump),
 * elsewhere the target's baseline (NEON on ARM, SSE2 on older x86). Sums of squares are accumulated in 8
 * lanes, then added lane by lane: results agree with torch's within fp32 rounding, not bit for bit. */
#include <math.h>

#define LANES 8

/* 8 partial sums: a single running sum is a chain the compiler may not reorder (no -ffast-math), so it would stay
 * scalar; 8 independent ones are one vector register */
static float sum_squares(const float *x, long d) {
    float acc[LANES] = {0};
    long i = 0;
    for (; i + LANES <= d; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += x[i + j] * x[i + j];
    /* lanes added in halves, as a vector horizontal sum does: 3 dependent adds, not 8 */
    float ss = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (; i < d; i++) ss += x[i] * x[i];
    return ss;
}

static void scale_row(const float *restrict x, const float *restrict w, float s, float *restrict out, long d) {
    for (long i = 0; i < d; i++) out[i] = x[i] * s * w[i];
}

static void add_rows(const float *restrict x, const float *restrict y, float *restrict out, long n) {
    for (long i = 0; i < n; i++) out[i] = x[i] + y[i];
}

static float inv_rms(const float *x, long d, float eps) { return 1.0f / sqrtf(sum_squares(x, d) / (float)d + eps); }

/* out = x * rsqrt(mean(x^2) + eps) * w, row by row */
void ms_rms_norm(const float *x, const float *w, float *out, long rows, long d, float eps) {
    for (long r = 0; r < rows; r++)
        scale_row(x + r * d, w, inv_rms(x + r * d, d, eps), out + r * d, d);
}

/* sum = x + residual; out = rms_norm(sum) * w: a layer's residual add and the norm after it */
void ms_add_rms_norm(const float *x, const float *residual, const float *w, float *sum, float *out, long rows,
                     long d, float eps) {
    add_rows(x, residual, sum, rows * d);
    ms_rms_norm(sum, w, out, rows, d, eps);
}

/* exp(x) for x in [-87, 0], without libm so that loops calling it vectorize (libm's expf is a scalar call):
 * x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two for an exact n ln2), exp(r) by its Taylor series to r^8
 * (truncation below 1e-8 relative), times 2^n (n >= -126, a normal float) built in the exponent bits. Within a
 * few ulp of expf. */
static inline float exp_neg(float x) {
    const float round = 12582912.0f; /* 1.5 * 2^23: adding and subtracting it rounds to the nearest integer */
    float n = (x * 1.44269504f + round) - round;
    float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.0f / 5040.0f + r * (1.0f / 40320.0f);
    p = 1.0f / 720.0f + r * p;
    p = 1.0f / 120.0f + r * p;
    p = 1.0f / 24.0f + r * p;
    p = 1.0f / 6.0f + r * p;
    p = 0.5f + r * p;
    p = 1.0f + r * p;
    p = 1.0f + r * p;
    union { int i; float f; } scale = {.i = ((int)n + 127) << 23};
    return p * scale.f;
}

/* -|g| clamped to >= -87 on its bits (for negative floats a larger magnitude is a larger signed int), so that no
 * float compare-and-select reaches the compiler: one let it if-convert silu's division into g / exp(88) on every
 * lane, a subnormal result, ~100x slower on x86 */
static inline float neg_abs_clamped(float g) {
    union { float f; int i; } v = {.f = -fabsf(g)}, floor = {.f = -87.0f};
    v.i = v.i < floor.i ? v.i : floor.i;
    return v.f;
}

/* gate_up: [rows, 2 * inter], gate first; out[rows, inter] = silu(gate) * up, silu(g) = g * sigmoid(g), with
 * sigmoid(g) = 1 / (1 + e) for g >= 0 and e / (1 + e) below, e = exp(-|g|) in [exp(-87), 1]: nothing overflows,
 * nothing is subnormal, and silu(g) -> g for large g, -> -0 (within 2e-38 |g|) for large -g */
void ms_silu_mul(const float *gate_up, float *out, long rows, long inter) {
    for (long r = 0; r < rows; r++) {
        const float *restrict g = gate_up + r * 2 * inter, *restrict u = g + inter;
        float *restrict o = out + r * inter;
        for (long i = 0; i < inter; i++) {
            float e = exp_neg(neg_abs_clamped(g[i]));
            o[i] = g[i] * ((g[i] >= 0.0f ? 1.0f : e) / (1.0f + e)) * u[i];
        }
    }
}

/* RoPE (rotate-half layout) on the query and key heads of a fused qkv projection, and the step's K/V written to
 * the paged cache. qkv: [rows, (h + 2 * kvh) * d], queries then keys then values; cos, signed_sin: [rows, d]
 * (signed_sin is sin with its first half negated); qk_out: [rows, h + kvh, d], the rotated queries and keys;
 * k_cache, v_cache: [num_slots, kvh, d]; slots[rows]: where each row's K/V go. Returns how many slots were out of
 * range (their rows are not written): the caller raises. */
long ms_rope_write_kv(const float *qkv, const float *cos, const float *signed_sin, const long *slots,
                      float *qk_out, float *k_cache, float *v_cache, long rows, long h, long kvh, long d,
                      long num_slots) {
    long half = d / 2, width = (h + 2 * kvh) * d, bad = 0;
    for (long r = 0; r < rows; r++) {
        const float *row = qkv + r * width, *c = cos + r * d, *s = signed_sin + r * d;
        float *out = qk_out + r * (h + kvh) * d;
        for (long head = 0; head < h + kvh; head++) {
            const float *x = row + head * d;
            float *o = out + head * d;
            for (long i = 0; i < half; i++) o[i] = x[i] * c[i] + x[i + half] * s[i];
            for (long i = half; i < d; i++) o[i] = x[i] * c[i] + x[i - half] * s[i];
        }
        long slot = slots[r];
        if (slot < 0 || slot >= num_slots) {
            bad++;
            continue;
        }
        float *kc = k_cache + slot * kvh * d, *vc = v_cache + slot * kvh * d;
        const float *k = out + h * d, *v = row + (h + kvh) * d;
        for (long i = 0; i < kvh * d; i++) {
            kc[i] = k[i];
            vc[i] = v[i];
        }
    }
    return bad;
}
