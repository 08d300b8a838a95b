// The table of local buffers registered with a Transport
// (register_buffer / unregister_buffer in runtime/transport.h), shared by
// the loopback, tcp and verbs backends: non-overlapping [begin, begin+length)
// ranges sorted by begin, each with a backend's extra datum (verbs keeps its
// ibv_mr there; the others keep nothing).
//
//   RegistrationTable<> t;
//   FARMEM_RETURN_IF_ERROR(t.insert(buf, len));   // refuses null, 0, wrap, overlap
//   const auto* e = t.find(op.local, op.length);  // entry covering the range, or null
//   FARMEM_RETURN_IF_ERROR(t.erase(buf));         // kNotFound unless buf is a start
//
// A plain value: copyable, so that tcp and verbs can keep it in their
// copy-on-write table versions; not synchronised, the owner locks. find()
// is a binary search that neither allocates nor locks: it runs per op on
// the fault path.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/status.h"

namespace farmem {

struct NoRegistrationData {};

template <class Extra = NoRegistrationData>
class RegistrationTable {
 public:
  struct Entry {
    uintptr_t begin = 0;
    size_t length = 0;
    Extra extra{};
  };

  // The checks insert() makes, without inserting: verbs runs them before
  // it pins memory with ibv_reg_mr, so that a refused range costs nothing.
  Status check_insert(const void* addr, size_t length) const {
    const auto begin = reinterpret_cast<uintptr_t>(addr);
    if (addr == nullptr || length == 0 || begin + length < begin)
      return make_error(Errc::kInvalidArgument,
                        "register_buffer(%p, %zu): need a non-null address and a length > 0 "
                        "that does not wrap",
                        addr, length);
    auto it = upper(begin);
    const Entry* clash = nullptr;
    if (it != entries_.begin() && (it - 1)->begin + (it - 1)->length > begin) clash = &*(it - 1);
    if (it != entries_.end() && begin + length > it->begin) clash = &*it;
    if (clash != nullptr)
      return make_error(Errc::kInvalidArgument,
                        "register_buffer(%p, %zu) overlaps the registered buffer %p of %zu "
                        "bytes; unregister it first or register disjoint ranges",
                        addr, length, reinterpret_cast<void*>(clash->begin), clash->length);
    return ok_status();
  }

  // kInvalidArgument for null, zero length, a range that wraps, or one
  // that overlaps a registered buffer (the same range twice included).
  Status insert(const void* addr, size_t length, Extra extra = {}) {
    FARMEM_RETURN_IF_ERROR(check_insert(addr, length));
    const auto begin = reinterpret_cast<uintptr_t>(addr);
    entries_.insert(upper(begin), Entry{begin, length, std::move(extra)});
    return ok_status();
  }

  // Removes the buffer registered at exactly `addr` (its start), handing
  // its extra datum to *removed when given. kNotFound otherwise.
  Status erase(const void* addr, Extra* removed = nullptr) {
    const auto begin = reinterpret_cast<uintptr_t>(addr);
    auto pos = std::lower_bound(entries_.begin(), entries_.end(), begin,
                                [](const Entry& e, uintptr_t v) { return e.begin < v; });
    if (pos == entries_.end() || pos->begin != begin)
      return make_error(Errc::kNotFound,
                        "unregister_buffer(%p): no buffer was registered at that address (pass "
                        "the start given to register_buffer)",
                        addr);
    if (removed != nullptr) *removed = std::move(pos->extra);
    entries_.erase(pos);
    return ok_status();
  }

  // The registered buffer that holds all of [addr, addr+length), or null
  // (also for length 0 and for a range that wraps).
  const Entry* find(const void* addr, size_t length) const {
    const auto p = reinterpret_cast<uintptr_t>(addr);
    auto it = upper(p);
    if (it == entries_.begin() || length == 0) return nullptr;
    --it;
    if (p - it->begin >= it->length || length > it->length - (p - it->begin)) return nullptr;
    return &*it;
  }

  const std::vector<Entry>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }

 private:
  // The first entry that starts after p.
  typename std::vector<Entry>::const_iterator upper(uintptr_t p) const {
    return std::upper_bound(entries_.begin(), entries_.end(), p,
                            [](uintptr_t v, const Entry& e) { return v < e.begin; });
  }

  std::vector<Entry> entries_;  // sorted by begin, non-overlapping
};

}  // namespace farmem
