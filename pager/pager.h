// The userfaultfd pager: a virtual region backed by far memory.
//
//   farmem::LoopbackDonor donor(1ull << 30, 16 << 20);
//   farmem::LoopbackTransport t;
//   (void)t.add_server(0, &donor);
//   farmem::LoopbackSlabSource src(0, &donor);
//   farmem::PagerConfig c;
//   c.region_size = 1ull << 30;  c.local_budget = 64 << 20;
//   auto p = farmem::Pager<farmem::LoopbackTransport>::create(c, &t, &src);
//   char* mem = static_cast<char*>((*p)->base());
//   mem[12345] = 7;                       // faults, served by a handler thread
#pragma once

#include "pager/evictor.h"
#include "pager/fault_path.h"
#include "pager/fork_path.h"
#include "pager/pager_core.h"
#include "pager/pager_init.h"
#include "pager/pin.h"
#include "pager/prefetch_path.h"
#include "pager/victim_move.h"
#include "pager/zero_fill.h"
