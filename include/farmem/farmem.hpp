// farmem for C++: an RAII runtime, an STL allocator and an owning far
// pointer, over the C API (farmem.h).
//
//   #include <farmem/farmem.hpp>
//
//   farmem::Runtime rt;                                  // fm_init(NULL): FARMEM_* env
//   std::vector<double, farmem::far_allocator<double>> v(1 << 28);  // 2 GiB, far
//   auto node = farmem::make_far<Node>(42, "x");         // far_ptr<Node>
//   fm_stats_t s = rt.stats();
//
// Errors throw: Runtime's constructor throws std::system_error (errno and
// fm_last_error() in what()); far_allocator throws std::bad_alloc like
// std::allocator; make_far throws std::bad_alloc. Far memory is ordinary
// memory: objects in it are constructed, used and destroyed as usual.
#pragma once

#include <cerrno>
#include <cstddef>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <system_error>
#include <utility>

#include "farmem/farmem.h"

namespace farmem {

// Starts farmem for the lifetime of the object (one per process).
class Runtime {
 public:
  Runtime() { start(nullptr); }  // from the environment
  explicit Runtime(const fm_config& config) { start(&config); }
  ~Runtime() { fm_shutdown(); }
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  fm_stats_t stats() const {
    fm_stats_t s;
    fm_stats_init(&s);
    if (fm_stats(&s) != 0) throw std::system_error(errno, std::generic_category(), fm_last_error());
    return s;
  }

 private:
  static void start(const fm_config* c) {
    if (fm_init(c) != 0) {
      throw std::system_error(errno, std::generic_category(),
                              std::string("farmem: ") + fm_last_error());
    }
  }
};

// Hints over fm_prefetch / fm_evict / fm_pin / fm_unpin (same ranges and
// block widening); they throw std::system_error with fm_last_error().
namespace detail {
inline void hint_result(int rc) {
  if (rc != 0) throw std::system_error(errno, std::generic_category(), fm_last_error());
}
}  // namespace detail
inline void prefetch(const void* p, std::size_t len) {
  detail::hint_result(fm_prefetch(p, len));
}
inline void evict(const void* p, std::size_t len) {
  detail::hint_result(fm_evict(p, len));
}
inline void pin(const void* p, std::size_t len) {
  detail::hint_result(fm_pin(p, len));
}
inline void unpin(const void* p, std::size_t len) {
  detail::hint_result(fm_unpin(p, len));
}

// Keeps [p, p+len) pinned for its lifetime:  farmem::pin_guard g(v.data(), bytes);
class pin_guard {
 public:
  pin_guard(const void* p, std::size_t len) : p_(p), len_(len) { pin(p, len); }
  ~pin_guard() { (void)fm_unpin(p_, len_); }
  pin_guard(const pin_guard&) = delete;
  pin_guard& operator=(const pin_guard&) = delete;

 private:
  const void* p_;
  std::size_t len_;
};

// std::allocator-compatible; stateless, all instances compare equal.
template <class T>
class far_allocator {
 public:
  using value_type = T;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using propagate_on_container_move_assignment = std::true_type;
  using is_always_equal = std::true_type;

  far_allocator() noexcept = default;
  template <class U>
  far_allocator(const far_allocator<U>&) noexcept {}  // NOLINT: rebinding is implicit

  [[nodiscard]] T* allocate(std::size_t n) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_array_new_length();
    void* p = alignof(T) > alignof(std::max_align_t) ? fm_aligned_alloc(alignof(T), n * sizeof(T))
                                                     : fm_malloc(n * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept { fm_free(p); }

  template <class U>
  bool operator==(const far_allocator<U>&) const noexcept {
    return true;
  }
};

// Owning pointer to one object in far memory (a unique_ptr whose deleter
// destroys the object and returns the memory with fm_free).
struct far_delete {
  template <class T>
  void operator()(T* p) const noexcept {
    p->~T();
    fm_free(const_cast<std::remove_const_t<T>*>(p));
  }
};
template <class T>
using far_ptr = std::unique_ptr<T, far_delete>;

template <class T, class... Args>
far_ptr<T> make_far(Args&&... args) {
  void* p = alignof(T) > alignof(std::max_align_t) ? fm_aligned_alloc(alignof(T), sizeof(T))
                                                   : fm_malloc(sizeof(T));
  if (p == nullptr) throw std::bad_alloc();
  try {
    return far_ptr<T>(::new (p) T(std::forward<Args>(args)...));
  } catch (...) {
    fm_free(p);
    throw;
  }
}

}  // namespace farmem
