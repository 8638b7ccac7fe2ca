// plan_ops.h - every op of a plan, for the compiler's verifier and the
// runtime alike (C++; include after plan_generated.h).
#ifndef DUCK_PLAN_OPS_H
#define DUCK_PLAN_OPS_H

#include "duck/plan/plan_generated.h"

#include <vector>

namespace duck::plan {

/// The main program's ops, then the MTP module's (PlanDef.mtp), whose
/// slots the weight images and host tensors the plan hold too.
inline std::vector<const OpDef *> AllOps(const PlanDef &d) {
  std::vector<const OpDef *> out;
  if (d.ops())
    out.assign(d.ops()->begin(), d.ops()->end());
  if (d.mtp() && d.mtp()->ops())
    out.insert(out.end(), d.mtp()->ops()->begin(), d.mtp()->ops()->end());
  return out;
}

} // namespace duck::plan

#endif
