// im2col family on the GPU; CPU twin in csrc/im2col.cpp, layouts in
// csrc/im2col.h: x (B,C,H,W); cols (K, B*P) with row (c,i,j), column (n,oh,ow).
#include "common.cuh"

// One thread per cols element; idx decomposes as (c, i, j, n, oh, ow).
extern "C" __global__ void sprint_im2col_f32(const float* __restrict__ x, float* __restrict__ cols,
                                             i64 B, i64 C, i64 H, i64 W, i64 kh, i64 kw, i64 sh,
                                             i64 sw, i64 ph, i64 pw, i64 OH, i64 OW) {
    const i64 total = C * kh * kw * B * OH * OW;
    SPRINT_FOR(idx, total) {
        i64 t = idx;
        const i64 ow = t % OW; t /= OW;
        const i64 oh = t % OH; t /= OH;
        const i64 n = t % B; t /= B;
        const i64 j = t % kw; t /= kw;
        const i64 i = t % kh;
        const i64 c = t / kh;
        const i64 h = oh * sh - ph + i, w = ow * sw - pw + j;
        cols[idx] = (h >= 0 && h < H && w >= 0 && w < W) ? x[((n * C + c) * H + h) * W + w] : 0.0f;
    }
}

// Gather: one thread per x element sums its contributions in (i, j) order.
extern "C" __global__ void sprint_col2im_f32(const float* __restrict__ cols, float* __restrict__ x,
                                             i64 B, i64 C, i64 H, i64 W, i64 kh, i64 kw, i64 sh,
                                             i64 sw, i64 ph, i64 pw, i64 OH, i64 OW) {
    const i64 total = B * C * H * W, P = OH * OW, BP = B * P;
    SPRINT_FOR(idx, total) {
        i64 t = idx;
        const i64 w = t % W; t /= W;
        const i64 h = t % H; t /= H;
        const i64 c = t % C;
        const i64 n = t / C;
        float acc = 0.0f;
        for (i64 i = 0; i < kh; ++i) {
            const i64 th = h + ph - i;
            if (th < 0) break;
            if (th % sh) continue;
            const i64 oh = th / sh;
            if (oh >= OH) continue;
            for (i64 j = 0; j < kw; ++j) {
                const i64 tw = w + pw - j;
                if (tw < 0) break;
                if (tw % sw) continue;
                const i64 ow = tw / sw;
                if (ow >= OW) continue;
                acc += cols[((c * kh + i) * kw + j) * BP + n * P + oh * OW + ow];
            }
        }
        x[idx] = acc;
    }
}

// y (B,M,P) <- yt (M,B*P) transposed (+ bias[m] if has_bias).
extern "C" __global__ void sprint_cnhw_to_nchw_f32(const float* __restrict__ yt, const float* __restrict__ bias,
                                                   i64 has_bias, float* __restrict__ y, i64 B, i64 M, i64 P) {
    SPRINT_FOR(idx, B * M * P) {
        const i64 p = idx % P, m = (idx / P) % M, n = idx / (P * M);
        y[idx] = yt[(m * B + n) * P + p] + (has_bias ? bias[m] : 0.0f);
    }
}

// out (M,B*P) <- y (B,M,P) transposed.
extern "C" __global__ void sprint_nchw_to_cnhw_f32(const float* __restrict__ y, float* __restrict__ out,
                                                   i64 B, i64 M, i64 P) {
    SPRINT_FOR(idx, B * M * P) {
        const i64 p = idx % P, n = (idx / P) % B, m = idx / (P * B);
        out[idx] = y[(n * M + m) * P + p];
    }
}

// db[m] (+)= sum over (n, p) of y[n,m,p]; one block of SPRINT_BLOCK threads per m.
extern "C" __global__ void sprint_channel_sum_f32(const float* __restrict__ y, float* __restrict__ db,
                                                  i64 accumulate, i64 B, i64 M, i64 P) {
    __shared__ float smem[SPRINT_BLOCK];
    for (i64 m = blockIdx.x; m < M; m += gridDim.x) {
        float s = 0.0f;
        for (i64 q = threadIdx.x; q < B * P; q += blockDim.x) s += y[((q / P) * M + m) * P + q % P];
        s = sprint_block_sum(s, smem);
        if (threadIdx.x == 0) db[m] = accumulate ? db[m] + s : s;
        __syncthreads();
    }
}

// y[n,m,p] += bias[m], in place.
extern "C" __global__ void sprint_add_channel_bias_f32(float* __restrict__ y, const float* __restrict__ bias,
                                                       i64 B, i64 M, i64 P) {
    SPRINT_FOR(idx, B * M * P) y[idx] += bias[(idx / P) % M];
}
