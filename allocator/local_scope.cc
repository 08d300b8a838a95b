#include "allocator/local_scope.h"

namespace farmem {

__thread int t_local_depth __attribute__((tls_model("initial-exec"))) = 0;

}  // namespace farmem
