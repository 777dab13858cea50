#include "core/rng.h"

#include <cmath>

namespace primus {

double Rng::normal() {
  const double u1 = uniform();
  return box_muller(u1, uniform());
}

}  // namespace primus
