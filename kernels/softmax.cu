// Softmax fused with cross-entropy and its gradient, one block per row
// (grid-stride over rows). Subtracting the row max keeps exp() in [0, 1], so
// logits of +-1e4 give no inf/nan. Per row:
//   probs = exp(x - m) / s,  loss = log(s) - (x[label] - m),
//   dlogits = (probs - onehot(label)) * inv_n   (inv_n = 1/N: gradient of the mean)
// blockDim.x must be a multiple of 32 (<= 1024): the launcher uses a warp for
// small K and up to 256 threads for large K, one block per row. A label outside 0..K-1 (the
// caller validates) yields a NaN loss and no out-of-bounds read. Labels are
// int64 here (the RawModule path passes them as such). CPU twin: csrc/softmax.cpp.
#include "common.cuh"

__device__ __forceinline__ float sprint_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float sprint_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block-wide reduction through one shared slot per warp; every thread gets the result.
__device__ float sprint_block_reduce(float v, bool is_max, float* smem) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    v = is_max ? sprint_warp_max(v) : sprint_warp_sum(v);
    __syncthreads();  // smem may still be read from the previous reduction
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    float r = smem[0];
    for (int k = 1; k < nwarps; ++k) r = is_max ? fmaxf(r, smem[k]) : r + smem[k];
    return r;
}

extern "C" __global__ void sprint_softmax_xent_f32(const float* __restrict__ logits,
                                                   const i64* __restrict__ labels,
                                                   float* __restrict__ probs,
                                                   float* __restrict__ dlogits,
                                                   float* __restrict__ row_loss, i64 N, i64 K_,
                                                   float inv_n) {
    __shared__ float smem[32];
    const int K = (int)K_;
    for (i64 row = blockIdx.x; row < N; row += gridDim.x) {
        const float* x = logits + row * K;
        float* p = probs + row * K;
        float* d = dlogits + row * K;
        float m = -3.402823466e38f;
        for (int j = threadIdx.x; j < K; j += blockDim.x) m = fmaxf(m, x[j]);
        m = sprint_block_reduce(m, true, smem);
        float s = 0.0f;
        for (int j = threadIdx.x; j < K; j += blockDim.x) {
            const float e = expf(x[j] - m);
            p[j] = e;
            s += e;
        }
        s = sprint_block_reduce(s, false, smem);
        const float inv_s = 1.0f / s;
        const i64 lab = labels[row];
        for (int j = threadIdx.x; j < K; j += blockDim.x) {
            const float pj = p[j] * inv_s;
            p[j] = pj;
            d[j] = (pj - (j == lab ? 1.0f : 0.0f)) * inv_n;
        }
        if (threadIdx.x == 0)
            row_loss[row] = (lab >= 0 && lab < K) ? logf(s) - (x[lab] - m) : __int_as_float(0x7fc00000);
    }
}
