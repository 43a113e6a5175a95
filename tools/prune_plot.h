// tools/prune_plot.h: the panels of `mha prune --plot`, apart from the
// drawing, so that tests can check what is drawn.
//
// Left: held-out accuracy against heads removed, one line per order: the
// random orders faint (one legend entry for all) with their mean, each
// measure's reverse order, each measure bold; measures whose curves coincide
// (gradient and ablation often give one order) are shifted by a fraction of
// a step so that none hides another. Right: forward latency against heads
// removed, the same x axis as the left panel.
#pragma once

#include <cstdint>
#include <vector>

#include "mha/plot.h"
#include "mha/prune_experiment.h"

namespace mha::tools {

// measured, reversed, random: curves of one experiment (accuracy[n] after n
// removals); latency[n], kept[n]: forward time and heads left after n.
std::vector<plot::LinePanel> prune_plot_panels(const std::vector<PruneCurve>& measured,
                                               const std::vector<PruneCurve>& reversed,
                                               const std::vector<PruneCurve>& random,
                                               const std::vector<double>& latency,
                                               const std::vector<int64_t>& kept);

}  // namespace mha::tools
