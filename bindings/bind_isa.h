// The CPU kernels' ISA argument, for the bindings of csrc/gemm.h and the
// kernels built on it: "" uses $SPRINT_CPU_ISA, then the best the CPU has;
// a name this CPU cannot run raises ValueError naming it.
#pragma once

#include <string>

#include "bind.h"
#include "gemm.h"

namespace sprint {
namespace bind {

inline gemm::Isa pick_isa(const std::string& isa) {
    gemm::Isa out;
    std::string err;
    if (!gemm::isa_select(isa, out, err)) value_error(err);
    return out;
}

}  // namespace bind
}  // namespace sprint
