# Every outside dependency, each from a Debian package that
# tools/install-deps.sh installs.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
# Verbs transport (libibverbs-dev, librdmacm-dev).
pkg_check_modules(FARMEM_IBVERBS IMPORTED_TARGET libibverbs)
pkg_check_modules(FARMEM_RDMACM IMPORTED_TARGET librdmacm)
# Far-memory allocator (libjemalloc-dev).
pkg_check_modules(FARMEM_JEMALLOC IMPORTED_TARGET jemalloc)
# RCU for read-mostly tables (liburcu-dev).
pkg_check_modules(FARMEM_URCU IMPORTED_TARGET liburcu)
# The pager's placement map uses the bulletproof flavour (pager/remote_map.cc says why).
pkg_check_modules(FARMEM_URCU_BP REQUIRED IMPORTED_TARGET liburcu-bp)
if(FARMEM_ENABLE_TESTS)
  find_package(GTest REQUIRED)
endif()
if(FARMEM_ENABLE_BENCH)
  find_package(benchmark REQUIRED)
endif()
