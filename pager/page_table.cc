#include "pager/page_table.h"

#include <sys/mman.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace farmem {
namespace {

using S = PageState;

constexpr bool kAllowed[kNumPageStates][kNumPageStates] = {
    // to: Empty Remote Present Victim Fetching Protecting Demoting Promoting Writing Discarding
    /* Empty      */ {0, 0, 0, 0, 1, 0, 0, 0, 0, 1},
    /* Remote     */ {0, 0, 0, 0, 1, 0, 0, 0, 0, 1},
    /* Present    */ {0, 0, 0, 0, 0, 1, 1, 0, 0, 1},
    /* Victim     */ {1, 1, 0, 0, 0, 0, 0, 1, 1, 1},
    /* Fetching   */ {0, 1, 1, 1, 0, 0, 0, 0, 0, 0},
    /* Protecting */ {0, 0, 1, 0, 0, 0, 0, 0, 0, 0},
    /* Demoting   */ {0, 1, 1, 1, 0, 0, 0, 0, 0, 0},
    /* Promoting  */ {0, 0, 1, 0, 0, 0, 0, 0, 0, 0},
    /* Writing    */ {0, 1, 0, 1, 0, 0, 0, 0, 0, 0},
    /* Discarding */ {1, 0, 0, 0, 0, 0, 0, 0, 0, 0},
};

}  // namespace

const char* page_state_name(PageState s) noexcept {
  switch (s) {
    case S::kEmpty:
      return "empty";
    case S::kRemote:
      return "remote";
    case S::kPresent:
      return "present";
    case S::kVictim:
      return "victim";
    case S::kFetching:
      return "fetching";
    case S::kProtecting:
      return "protecting";
    case S::kDemoting:
      return "demoting";
    case S::kPromoting:
      return "promoting";
    case S::kWriting:
      return "writing";
    case S::kDiscarding:
      return "discarding";
  }
  return "invalid";
}

bool page_transition_allowed(PageState from, PageState to) noexcept {
  auto f = static_cast<unsigned>(from), t = static_cast<unsigned>(to);
  if (f >= kNumPageStates || t >= kNumPageStates) return false;
  return kAllowed[f][t];
}

PageTable::~PageTable() {
  if (blocks_) munmap(blocks_, bytes_);
}

Status PageTable::init(uint64_t n_blocks) {
  if (n_blocks == 0 || n_blocks >= kNil) {
    return make_error(Errc::kInvalidArgument,
                      "page table of %llu blocks: must be 1 .. 2^32-2 blocks; use a bigger "
                      "block size or a smaller region",
                      static_cast<unsigned long long>(n_blocks));
  }
  bytes_ = n_blocks * (sizeof(BlockMeta) + 3 * sizeof(uint32_t));
  // Anonymous zero pages are a valid all-Empty table: word 0 = kEmpty,
  // remote 0 = none. prev/next are only read in states that set them.
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return make_error(Errc::kResourceExhausted, "mmap of %zu bytes of page table failed: %s",
                      bytes_, strerror(errno));
  }
  blocks_ = static_cast<BlockMeta*>(p);
  remotes_ = reinterpret_cast<uint32_t*>(blocks_ + n_blocks);
  hashes_ = remotes_ + n_blocks;
  access_ = hashes_ + n_blocks;
  n_ = n_blocks;
  return ok_status();
}

size_t PageTable::resident_bytes() const {
  FILE* f = fopen("/proc/self/smaps", "re");
  if (f == nullptr) return 0;
  const uintptr_t base = reinterpret_cast<uintptr_t>(blocks_);
  char line[512];
  bool in = false;
  size_t rss = 0;
  while (fgets(line, sizeof line, f) != nullptr) {
    uintptr_t lo, hi;
    if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &lo, &hi) == 2) {
      in = lo == base;
      continue;
    }
    unsigned long kib;
    if (in && sscanf(line, "Rss: %lu kB", &kib) == 1) {
      rss = kib << 10;
      break;
    }
  }
  fclose(f);
  return rss;
}

void BlockList::push_front(uint32_t b) {
  BlockMeta& m = pt_->meta(b);
  m.prev = kNil;
  m.next = head_;
  if (head_ != kNil) pt_->meta(head_).prev = b;
  head_ = b;
  if (tail_ == kNil) tail_ = b;
  ++size_;
}

void BlockList::remove(uint32_t b) {
  BlockMeta& m = pt_->meta(b);
  if (m.prev != kNil) {
    pt_->meta(m.prev).next = m.next;
  } else {
    FARMEM_BUG_ON(head_ != b);
    head_ = m.next;
  }
  if (m.next != kNil) {
    pt_->meta(m.next).prev = m.prev;
  } else {
    FARMEM_BUG_ON(tail_ != b);
    tail_ = m.prev;
  }
  m.prev = m.next = kNil;
  --size_;
}

}  // namespace farmem
