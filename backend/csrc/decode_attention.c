/* One decode step's attention over a key/value cache: backend/rollout/decode_attention.py states the contract.
 *
 * q (B, H, D); k, v (B, G, W, D), positions 0 .. end-1 read; attend (B, attend_stride) bytes, nonzero where a
 * row may attend to a position; out (B, H, D). Query head h reads key/value head h / (H / G) (grouped-query
 * attention). Every row must attend to at least one position. One pass over each row's keys for the scores, a
 * softmax, one pass over its values: each cached float is read once, and no intermediate leaves the cache. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

int decode_attention(const float *q, const float *k, const float *v, const uint8_t *attend, float *out, int64_t B,
                     int64_t H, int64_t G, int64_t D, int64_t W, int64_t end, int64_t attend_stride, float scale,
                     int threads) {
    const int64_t per = H / G;
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1) reduction(| : failed)
    {
        float *s = (float *)malloc(sizeof(float) * (size_t)(end > 0 ? end : 1));
        failed |= s == NULL;
#pragma omp for collapse(2) schedule(static)
        for (int64_t b = 0; b < B; b++) {
            for (int64_t h = 0; h < H; h++) {
                if (s == NULL) continue;
                const float *qh = q + (b * H + h) * D;
                const float *kh = k + (b * G + h / per) * W * D;
                const float *vh = v + (b * G + h / per) * W * D;
                const uint8_t *a = attend + b * attend_stride;
                float m = -INFINITY;
                for (int64_t j = 0; j < end; j++) {
                    const float *kj = kh + j * D;
                    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                    for (int64_t d = 0; d < D; d++) dot += qh[d] * kj[d];
                    s[j] = a[j] ? dot * scale : -INFINITY;
                    m = s[j] > m ? s[j] : m;
                }
                float sum = 0.f;
                for (int64_t j = 0; j < end; j++) {
                    s[j] = a[j] ? expf(s[j] - m) : 0.f;
                    sum += s[j];
                }
                float *o = out + (b * H + h) * D;
                for (int64_t d = 0; d < D; d++) o[d] = 0.f;
                for (int64_t j = 0; j < end; j++) {
                    if (s[j] == 0.f) continue;
                    const float p = s[j];
                    const float *vj = vh + j * D;
#pragma omp simd
                    for (int64_t d = 0; d < D; d++) o[d] += p * vj[d];
                }
                const float inv = 1.f / sum;
                for (int64_t d = 0; d < D; d++) o[d] *= inv;
            }
        }
        free(s);
    }
    return failed;
}
