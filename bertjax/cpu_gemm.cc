// XLA:CPU FFI handler: batched fp32 GEMM through a vendor BLAS (see cpu_gemm.py for the contract).
//
//   c[i] = op_a(a[i]) . op_b(b[i])   for i in [0, batch)
//
// a, b, c are row-major, rank 2 (batch 1) or rank 3 (leading batch dim on all three). op_x is a
// transpose when the attribute trans_x is non-zero, so a is stored <M, K> or <K, M> and b <K, N> or
// <N, K>; c is <M, N>. The BLAS sgemm is single-threaded (the loader picks a sequential layer);
// parallelism comes from XLA's own intra-op thread pool, so the BLAS never competes with XLA for
// cores and nothing spins between calls. Work is cut into chunks (batch entries, or blocks of c)
// that the calling thread and pool tasks take from a shared counter. The calling thread only
// waits for chunks another thread has already started, never for a task still queued, so the
// handler cannot deadlock when every pool thread is busy in another handler.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// cblas_sgemm with 32-bit integers (the LP64 interface); enum arguments are plain ints.
using SgemmFn = void (*)(int layout, int trans_a, int trans_b, int m, int n, int k, float alpha,
                         const float* a, int lda, const float* b, int ldb, float beta, float* c,
                         int ldc);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
std::atomic<SgemmFn> g_sgemm{nullptr};

// Blocks of c narrower than this are not worth a task of their own.
constexpr int64_t kMinBlock = 32;

struct Work {
  int64_t total = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable finished;
  // Set by the caller before any task can run; only called for chunk ids < total.
  std::function<void(int64_t)> chunk;
};

void Drain(Work& work) {
  for (;;) {
    const int64_t id = work.next.fetch_add(1);
    if (id >= work.total) return;
    work.chunk(id);
    if (work.done.fetch_add(1) + 1 == work.total) {
      std::lock_guard<std::mutex> lock(work.mu);
      work.finished.notify_all();
    }
  }
}

ffi::Error Gemm(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                ffi::ResultBuffer<ffi::F32> c, int64_t trans_a, int64_t trans_b) {
  const SgemmFn sgemm = g_sgemm.load();
  if (sgemm == nullptr) return ffi::Error::Internal("bertjax_sgemm: no BLAS sgemm was set");
  const auto ad = a.dimensions(), bd = b.dimensions(), cd = c->dimensions();
  const size_t rank = ad.size();
  if ((rank != 2 && rank != 3) || bd.size() != rank || cd.size() != rank) {
    return ffi::Error::InvalidArgument("bertjax_sgemm: operands must all be rank 2 or all rank 3");
  }
  const int64_t batch = rank == 3 ? ad[0] : 1;
  const size_t r = rank - 2;
  const int64_t m = trans_a ? ad[r + 1] : ad[r], k = trans_a ? ad[r] : ad[r + 1];
  const int64_t n = trans_b ? bd[r] : bd[r + 1], kb = trans_b ? bd[r + 1] : bd[r];
  if (kb != k || cd[r] != m || cd[r + 1] != n || (rank == 3 && (bd[0] != batch || cd[0] != batch))) {
    return ffi::Error::InvalidArgument("bertjax_sgemm: operand shapes do not match");
  }
  const int64_t kMaxInt = 0x7fffffff;
  if (m > kMaxInt || n > kMaxInt || k > kMaxInt) {
    return ffi::Error::InvalidArgument("bertjax_sgemm: a dimension exceeds 2^31-1");
  }
  float* out = c->typed_data();
  if (batch == 0 || m == 0 || n == 0) return ffi::Error::Success();
  if (k == 0) {  // an empty sum; BLAS rejects the zero leading dimension this would pass
    std::fill(out, out + batch * m * n, 0.0f);
    return ffi::Error::Success();
  }
  const float* a_data = a.typed_data();
  const float* b_data = b.typed_data();
  const int lda = static_cast<int>(trans_a ? m : k), ldb = static_cast<int>(trans_b ? k : n);
  const int ta = trans_a ? kTrans : kNoTrans, tb = trans_b ? kTrans : kNoTrans;

  // One chunk per batch entry. A single matrix is cut into blocks of c along its longer side:
  // each block packs its slice of that operand and all of the other, so cutting the long side
  // keeps the repeated packing small (the MLM decoder's <V=30522, H> operand is tens of MB).
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const bool split_rows = m >= n;
  const int64_t extent = split_rows ? m : n;
  const int64_t blocks =
      batch > 1 ? 1 : std::max<int64_t>(1, std::min(threads, extent / kMinBlock));
  const int64_t per_block = (extent + blocks - 1) / blocks;

  auto work = std::make_shared<Work>();
  work->total = batch * blocks;
  work->chunk = [=](int64_t id) {
    const int64_t i = id / blocks;
    const int64_t start = (id % blocks) * per_block;
    const int64_t size = std::min(per_block, extent - start);
    if (size <= 0) return;
    const float* a_i = a_data + i * m * k;
    const float* b_i = b_data + i * k * n;
    float* c_i = out + i * m * n;
    if (split_rows) {  // rows start.. of op_a(a): rows of a, or columns of a stored transposed
      sgemm(kRowMajor, ta, tb, static_cast<int>(size), static_cast<int>(n), static_cast<int>(k),
            1.0f, a_i + (trans_a ? start : start * k), lda, b_i, ldb, 0.0f, c_i + start * n,
            static_cast<int>(n));
    } else {  // columns start.. of op_b(b): columns of b, or rows of b stored transposed
      sgemm(kRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(size), static_cast<int>(k),
            1.0f, a_i, lda, b_i + (trans_b ? start * k : start), ldb, 0.0f, c_i + start,
            static_cast<int>(n));
    }
  };
  const int64_t helpers = std::min(threads, work->total) - 1;
  for (int64_t t = 0; t < helpers; ++t) {
    pool.Schedule([work] { Drain(*work); });
  }
  Drain(*work);
  std::unique_lock<std::mutex> lock(work->mu);
  work->finished.wait(lock, [&] { return work->done.load() == work->total; });
  return ffi::Error::Success();
}

}  // namespace

extern "C" __attribute__((visibility("default"))) void bertjax_set_sgemm(void* fn) {
  g_sgemm.store(reinterpret_cast<SgemmFn>(fn));
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(BertjaxSgemm, Gemm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("trans_a")
                                  .Attr<int64_t>("trans_b"));
