/* A cache for the largest heap blocks, preloaded into CPU runs (see bertjax/cpu_malloc.py).
 *
 * XLA:CPU mallocs each execution's temporary buffer (every activation of a train step, ~1.3 GB
 * for BERT-base at 8x128) and frees it when the step ends. glibc serves such blocks with a fresh
 * mmap and unmaps them on free, so every step the kernel faults the whole buffer in again and
 * zeroes it. This library interposes malloc and friends: requests of at least
 * BERTJAX_BIG_BLOCK_MIN bytes (default 64 MiB) get their own 2 MiB-aligned mapping marked
 * MADV_HUGEPAGE, and freeing one keeps the mapping for the next request it fits (capacity within
 * 1.25x of the request), if blocks of its size were requested more than once, up to MAX_CACHED
 * free blocks; one-off blocks, and cached ones unused for STALE_EVENTS big-block allocations
 * and frees, are unmapped as glibc would. Every other call
 * goes to glibc's own allocator (__libc_malloc etc.), so only a handful of blocks per process
 * ever take this path, and the memory held beyond what glibc would hold is bounded by the
 * cached blocks, which a steady training loop reuses every step.
 *
 * Our blocks are recognised on free() by a tag in the 16 bytes before the pointer (the place of
 * glibc's chunk header, readable for every pointer malloc returned), confirmed against the table
 * of live blocks under a lock; anything else goes to __libc_free.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

#define HUGE_PAGE ((size_t)2 << 20)
#define MAX_BLOCKS 64
#define MAX_CACHED 4
#define STALE_EVENTS 16 /* a cached block unused for this many big-block events is unmapped */
#define TAG 0x6265727462696721ULL /* "bertbig!" */

typedef struct {
  char *base;     /* start of the mapping (HUGE_PAGE aligned), NULL if the slot is empty */
  size_t length;  /* bytes mapped */
  char *user;     /* pointer handed out */
  int in_use;
  uint64_t freed_at; /* value of `events` when it entered the cache */
} block_t;

static block_t blocks[MAX_BLOCKS];

/* Sizes requested so far (within 1.25x counts as the same), to cache only recurring blocks. */
#define MAX_SIZES 16
static struct { size_t length; uint64_t count, last; } sizes[MAX_SIZES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t freed = PTHREAD_COND_INITIALIZER;
static uint64_t events; /* big-block allocations and frees so far */
static size_t big_min = (size_t)64 << 20;
static long wait_ms = 50;
static size_t stats[3]; /* maps, reuses, unmaps */

__attribute__((constructor)) static void init(void) {
  const char *env = getenv("BERTJAX_BIG_BLOCK_MIN");
  if (env && *env) {
    char *end;
    unsigned long long v = strtoull(env, &end, 10);
    if (*end == '\0' && v >= ((size_t)1 << 20)) big_min = (size_t)v;
  }
  env = getenv("BERTJAX_BIG_BLOCK_WAIT_MS");
  if (env && *env) {
    char *end;
    long v = strtol(env, &end, 10);
    if (*end == '\0' && v >= 0 && v <= 10000) wait_ms = v;
  }
}

static void before_fork(void) { pthread_mutex_lock(&lock); }
static void after_fork(void) { pthread_mutex_unlock(&lock); }
__attribute__((constructor)) static void register_fork(void) {
  pthread_atfork(before_fork, after_fork, after_fork);
}

/* The header offset for an alignment: the user pointer must have 16 writable bytes before it. */
static size_t offset_for(size_t alignment) { return alignment > 4096 ? alignment : 4096; }

static void *map_block(size_t length) {
  /* Over-map by one huge page and trim, so the block starts on a huge-page boundary. */
  char *raw = mmap(NULL, length + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
  if (raw == MAP_FAILED) return NULL;
  char *base = (char *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
  if (base > raw) munmap(raw, (size_t)(base - raw));
  size_t tail = (size_t)(raw + length + HUGE_PAGE - (base + length));
  if (tail) munmap(base + length, tail);
  madvise(base, length, MADV_HUGEPAGE);
  return base;
}

/* Unmaps the block in slot i and empties the slot. Called with the lock held. */
static void release(int i) {
  munmap(blocks[i].base, blocks[i].length);
  blocks[i].base = NULL;
  stats[2]++;
}

/* Unmaps cached blocks beyond MAX_CACHED (longest cached first) and those left unused for
 * STALE_EVENTS big-block events. Called with the lock held. */
static void evict(void) {
  for (;;) {
    int cached = 0, oldest = -1;
    for (int j = 0; j < MAX_BLOCKS; j++) {
      block_t *b = &blocks[j];
      if (!b->base || b->in_use) continue;
      cached++;
      if (oldest < 0 || b->freed_at < blocks[oldest].freed_at) oldest = j;
    }
    if (oldest < 0 || (cached <= MAX_CACHED && blocks[oldest].freed_at + STALE_EVENTS > events))
      return;
    release(oldest);
  }
}

/* Best-fitting cached block for `length` bytes (-1 if none), and whether a block in use would
 * fit (its free() may be moments away). Called with the lock held. */
static int best_fit(size_t length, int *busy_fits) {
  int best = -1;
  *busy_fits = 0;
  for (int i = 0; i < MAX_BLOCKS; i++) {
    block_t *b = &blocks[i];
    if (!b->base || b->length < length || b->length - length > length / 4) continue;
    if (b->in_use) {
      *busy_fits = 1;
    } else if (best < 0 || b->length < blocks[best].length) {
      best = i;
    }
  }
  return best;
}

static int same_size(size_t a, size_t b) {
  size_t lo = a < b ? a : b, hi = a < b ? b : a;
  return hi - lo <= lo / 4;
}

/* Counts one request of `length` bytes. Called with the lock held. */
static void count_size(size_t length) {
  int slot = 0;
  for (int i = 0; i < MAX_SIZES; i++) {
    if (sizes[i].count && same_size(sizes[i].length, length)) {
      sizes[i].count++;
      sizes[i].last = events;
      return;
    }
    if (sizes[i].last < sizes[slot].last) slot = i; /* least recently requested (or empty) */
  }
  sizes[slot].length = length;
  sizes[slot].count = 1;
  sizes[slot].last = events;
}

/* Whether blocks of `length` bytes were requested more than once (worth keeping). */
static int recurring(size_t length) {
  for (int i = 0; i < MAX_SIZES; i++)
    if (sizes[i].count > 1 && same_size(sizes[i].length, length)) return 1;
  return 0;
}

static void *big_alloc(size_t size, size_t alignment) {
  size_t offset = offset_for(alignment);
  if (size > SIZE_MAX - offset - 2 * HUGE_PAGE) return NULL;
  size_t length = (size + offset + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
  pthread_mutex_lock(&lock);
  events++;
  count_size(length);
  int busy_fits;
  int best = best_fit(length, &busy_fits);
  if (best < 0 && busy_fits && wait_ms > 0) {
    /* XLA allocates a step's buffer when the step is dispatched, which can be just before the
     * previous step's buffer is freed: wait a little for that block rather than map (and
     * page in) a second one. Bounded, so it can never deadlock. */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += (wait_ms % 1000) * 1000000L;
    until.tv_sec += wait_ms / 1000 + until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    while (best < 0 && busy_fits) {
      if (pthread_cond_timedwait(&freed, &lock, &until) != 0) break;
      best = best_fit(length, &busy_fits);
    }
    if (best < 0) best = best_fit(length, &busy_fits);
  }
  if (best >= 0) {
    block_t *b = &blocks[best];
    b->in_use = 1;
    b->user = b->base + offset;
    stats[1]++;
    evict();
    pthread_mutex_unlock(&lock);
    ((uint64_t *)b->user)[-2] = TAG;
    return b->user;
  }
  int slot = -1;
  for (int i = 0; i < MAX_BLOCKS && slot < 0; i++)
    if (!blocks[i].base) slot = i;
  char *base = slot >= 0 ? map_block(length) : NULL;
  if (base) {
    blocks[slot] = (block_t){base, length, base + offset, 1, 0};
    stats[0]++;
  }
  evict();
  pthread_mutex_unlock(&lock);
  if (!base) return NULL; /* caller falls back to glibc */
  ((uint64_t *)(base + offset))[-2] = TAG;
  return base + offset;
}

/* The table slot of one of our live blocks, or -1. Called with the lock held. */
static int find_live(void *p) {
  for (int i = 0; i < MAX_BLOCKS; i++)
    if (blocks[i].base && blocks[i].in_use && blocks[i].user == p) return i;
  return -1;
}

static int is_tagged(void *p) {
  return p && ((uintptr_t)p & 4095) == 0 && ((uint64_t *)p)[-2] == TAG;
}

/* Returns 1 if p was ours (now cached or unmapped), 0 if it belongs to glibc. */
static int big_free(void *p) {
  if (!is_tagged(p)) return 0;
  pthread_mutex_lock(&lock);
  int i = find_live(p);
  if (i < 0) {
    pthread_mutex_unlock(&lock);
    return 0;
  }
  blocks[i].in_use = 0;
  blocks[i].freed_at = ++events;
  if (recurring(blocks[i].length))
    evict();
  else
    release(i); /* a one-off block: unmapped now, as glibc would */
  pthread_cond_broadcast(&freed);
  pthread_mutex_unlock(&lock);
  return 1;
}

static size_t big_usable(void *p, int *ours) {
  *ours = 0;
  if (!is_tagged(p)) return 0;
  pthread_mutex_lock(&lock);
  int i = find_live(p);
  size_t usable = i >= 0 ? blocks[i].length - (size_t)(blocks[i].user - blocks[i].base) : 0;
  pthread_mutex_unlock(&lock);
  *ours = i >= 0;
  return usable;
}

void *malloc(size_t size) {
  if (size >= big_min) {
    void *p = big_alloc(size, 16);
    if (p) return p;
  }
  return __libc_malloc(size);
}

void free(void *p) {
  if (!big_free(p)) __libc_free(p);
}

void *memalign(size_t alignment, size_t size) {
  if (size >= big_min && alignment <= HUGE_PAGE && (alignment & (alignment - 1)) == 0) {
    void *p = big_alloc(size, alignment);
    if (p) return p;
  }
  return __libc_memalign(alignment, size);
}

int posix_memalign(void **out, size_t alignment, size_t size) {
  if (alignment % sizeof(void *) != 0 || (alignment & (alignment - 1)) != 0) return EINVAL;
  void *p = memalign(alignment, size);
  if (!p && size) return ENOMEM;
  *out = p;
  return 0;
}

void *aligned_alloc(size_t alignment, size_t size) { return memalign(alignment, size); }

void *realloc(void *p, size_t size) {
  int ours;
  size_t usable = big_usable(p, &ours);
  if (!ours) return __libc_realloc(p, size);
  if (size <= usable && size >= big_min) return p;
  void *q = malloc(size);
  if (!q) return NULL;
  memcpy(q, p, size < usable ? size : usable);
  free(p);
  return q;
}

/* glibc's own reallocarray would hand our block to its realloc: route it through ours. */
void *reallocarray(void *p, size_t count, size_t size) {
  if (size && count > SIZE_MAX / size) {
    errno = ENOMEM;
    return NULL;
  }
  return realloc(p, count * size);
}

size_t malloc_usable_size(void *p) {
  int ours;
  size_t usable = big_usable(p, &ours);
  if (ours) return usable;
  static size_t (*next)(void *);
  if (!next) next = (size_t(*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
  return next ? next(p) : 0;
}

/* Counters for bertjax.cpu_malloc.cache_stats(): maps, reuses, unmaps, bytes cached now, and
 * the threshold. */
void bertjax_big_block_stats(size_t out[5]) {
  pthread_mutex_lock(&lock);
  for (int i = 0; i < 3; i++) out[i] = stats[i];
  out[3] = 0;
  for (int i = 0; i < MAX_BLOCKS; i++)
    if (blocks[i].base && !blocks[i].in_use) out[3] += blocks[i].length;
  out[4] = big_min;
  pthread_mutex_unlock(&lock);
}
