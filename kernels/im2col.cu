// im2col family on the GPU; CPU twin in csrc/im2col.cpp, layouts in
// csrc/im2col.h: x (B,C,H,W); cols (K, B*P) with row (c,i,j), column (n,oh,ow).
#include "common.cuh"

// Kernel bodies are templates on the index type I (unsigned or i64); each
// extern "C" kernel picks I from the largest index it will form.

// One thread per cols element; idx decomposes as (c, i, j, n, oh, ow).
template <typename I>
__device__ __forceinline__ void im2col_body(const float* __restrict__ x, float* __restrict__ cols, I B, I C, I H,
                                            I W, I kh, I kw, I sh, I sw, I ph, I pw, I OH, I OW) {
    const I total = C * kh * kw * B * OH * OW;
    SPRINT_FOR_T(I, idx, total) {
        I t = idx;
        const I ow = t % OW; t /= OW;
        const I oh = t % OH; t /= OH;
        const I n = t % B; t /= B;
        const I j = t % kw; t /= kw;
        const I i = t % kh;
        const I c = t / kh;
        // unsigned wrap-around makes "h < 0" an "h >= H" test
        const I h = oh * sh + i - ph, w = ow * sw + j - pw;
        const bool inside = oh * sh + i >= ph && h < H && ow * sw + j >= pw && w < W;
        cols[idx] = inside ? x[((n * C + c) * H + h) * W + w] : 0.0f;
    }
}

extern "C" __global__ void sprint_im2col_f32(const float* __restrict__ x, float* __restrict__ cols,
                                             i64 B, i64 C, i64 H, i64 W, i64 kh, i64 kw, i64 sh,
                                             i64 sw, i64 ph, i64 pw, i64 OH, i64 OW) {
    const i64 nc = sprint_size_mul(sprint_size3(C, kh, kw), sprint_size3(B, OH, OW));
    const i64 nx = sprint_size_mul(sprint_size_mul(B, C), sprint_size_mul(H, W));
    if (nc <= 0 || nx < 0 || sh < 1 || sw < 1 || ph < 0 || pw < 0 || ph > SPRINT_MAX_ELEMS || pw > SPRINT_MAX_ELEMS)
        return;
    if (nc <= SPRINT_NARROW_INDEX_MAX && nx <= SPRINT_NARROW_INDEX_MAX &&
        (OH - 1) * sh + kh <= SPRINT_NARROW_INDEX_MAX && (OW - 1) * sw + kw <= SPRINT_NARROW_INDEX_MAX)
        im2col_body<unsigned>(x, cols, B, C, H, W, kh, kw, sh, sw, ph, pw, OH, OW);
    else
        im2col_body<i64>(x, cols, B, C, H, W, kh, kw, sh, sw, ph, pw, OH, OW);
}

// Gather: one thread per x element sums its contributions in (i, j) order.
// Padded pixel hp = h + ph is read by the windows (oh, i) with oh*sh + i == hp,
// 0 <= i < kh, 0 <= oh < OH: only those are visited (oh descending is i
// ascending), so a thread's work is its number of contributions, not kh*kw
// -- a huge kernel with a huge stride (few windows) stays cheap.
template <typename I>
__device__ __forceinline__ void col2im_body(const float* __restrict__ cols, float* __restrict__ x, I B, I C, I H,
                                            I W, I kh, I kw, I sh, I sw, I ph, I pw, I OH, I OW) {
    const I total = B * C * H * W, P = OH * OW, BP = B * P;
    SPRINT_FOR_T(I, idx, total) {
        I t = idx;
        const I w = t % W; t /= W;
        const I h = t % H; t /= H;
        const I c = t % C;
        const I n = t / C;
        const I hp = h + ph, wp = w + pw;
        // windows oh in [oh_lo, oh_hi]: oh*sh <= hp and hp - oh*sh < kh (unsigned-safe forms)
        const I oh_lo = hp >= kh ? (hp - kh) / sh + 1 : 0, ow_lo = wp >= kw ? (wp - kw) / sw + 1 : 0;
        const I oh_end = hp / sh < OH ? hp / sh + 1 : OH, ow_end = wp / sw < OW ? wp / sw + 1 : OW;
        float acc = 0.0f;
        for (I oh = oh_end; oh > oh_lo; --oh) {
            const I i = hp - (oh - 1) * sh;
            for (I ow = ow_end; ow > ow_lo; --ow) {
                const I j = wp - (ow - 1) * sw;
                acc += cols[((c * kh + i) * kw + j) * BP + n * P + (oh - 1) * OW + (ow - 1)];
            }
        }
        x[idx] = acc;
    }
}

extern "C" __global__ void sprint_col2im_f32(const float* __restrict__ cols, float* __restrict__ x,
                                             i64 B, i64 C, i64 H, i64 W, i64 kh, i64 kw, i64 sh,
                                             i64 sw, i64 ph, i64 pw, i64 OH, i64 OW) {
    const i64 nc = sprint_size_mul(sprint_size3(C, kh, kw), sprint_size3(B, OH, OW));
    const i64 nx = sprint_size_mul(sprint_size_mul(B, C), sprint_size_mul(H, W));
    if (nc < 0 || nx <= 0 || sh < 1 || sw < 1 || ph < 0 || pw < 0 || ph > SPRINT_MAX_ELEMS || pw > SPRINT_MAX_ELEMS)
        return;
    if (nc <= SPRINT_NARROW_INDEX_MAX && nx <= SPRINT_NARROW_INDEX_MAX &&
        H + ph <= SPRINT_NARROW_INDEX_MAX && W + pw <= SPRINT_NARROW_INDEX_MAX)
        col2im_body<unsigned>(cols, x, B, C, H, W, kh, kw, sh, sw, ph, pw, OH, OW);
    else
        col2im_body<i64>(cols, x, B, C, H, W, kh, kw, sh, sw, ph, pw, OH, OW);
}

// y (B,M,P) <- yt (M,B*P) transposed (+ bias[m] if has_bias).
template <typename I>
__device__ __forceinline__ void cnhw_to_nchw_body(const float* __restrict__ yt, const float* __restrict__ bias,
                                                  bool has_bias, float* __restrict__ y, I B, I M, I P) {
    SPRINT_FOR_T(I, idx, B * M * P) {
        const I p = idx % P, m = (idx / P) % M, n = idx / (P * M);
        y[idx] = yt[(m * B + n) * P + p] + (has_bias ? bias[m] : 0.0f);
    }
}

extern "C" __global__ void sprint_cnhw_to_nchw_f32(const float* __restrict__ yt, const float* __restrict__ bias,
                                                   i64 has_bias, float* __restrict__ y, i64 B, i64 M, i64 P) {
    const i64 n = sprint_size3(B, M, P);
    if (n <= 0) return;
    if (n <= SPRINT_NARROW_INDEX_MAX)
        cnhw_to_nchw_body<unsigned>(yt, bias, has_bias != 0, y, B, M, P);
    else
        cnhw_to_nchw_body<i64>(yt, bias, has_bias != 0, y, B, M, P);
}

// out (M,B*P) <- y (B,M,P) transposed.
template <typename I>
__device__ __forceinline__ void nchw_to_cnhw_body(const float* __restrict__ y, float* __restrict__ out, I B, I M,
                                                  I P) {
    SPRINT_FOR_T(I, idx, B * M * P) {
        const I p = idx % P, n = (idx / P) % B, m = idx / (P * B);
        out[idx] = y[(n * M + m) * P + p];
    }
}

extern "C" __global__ void sprint_nchw_to_cnhw_f32(const float* __restrict__ y, float* __restrict__ out,
                                                   i64 B, i64 M, i64 P) {
    const i64 n = sprint_size3(B, M, P);
    if (n <= 0) return;
    if (n <= SPRINT_NARROW_INDEX_MAX)
        nchw_to_cnhw_body<unsigned>(y, out, B, M, P);
    else
        nchw_to_cnhw_body<i64>(y, out, B, M, P);
}

// db[m] (+)= sum over (n, p) of y[n,m,p]; one block of SPRINT_BLOCK threads per m.
extern "C" __global__ void sprint_channel_sum_f32(const float* __restrict__ y, float* __restrict__ db,
                                                  i64 accumulate, i64 B, i64 M, i64 P) {
    __shared__ float smem[SPRINT_BLOCK];
    const i64 BP = sprint_size_mul(B, P);
    if (BP < 0 || sprint_size_mul(BP, M) < 0) return;
    for (i64 m = blockIdx.x; m < M; m += gridDim.x) {
        float s = 0.0f;
        for (i64 q = threadIdx.x; q < BP; q += blockDim.x) s += y[((q / P) * M + m) * P + q % P];
        s = sprint_block_sum(s, smem);
        if (threadIdx.x == 0) db[m] = accumulate ? db[m] + s : s;
        __syncthreads();
    }
}

// y[n,m,p] += bias[m], in place.
extern "C" __global__ void sprint_add_channel_bias_f32(float* __restrict__ y, const float* __restrict__ bias,
                                                       i64 B, i64 M, i64 P) {
    const i64 n = sprint_size3(B, M, P);
    SPRINT_FOR(idx, n) y[idx] += bias[(idx / P) % M];
}
