// The tune report as a self-contained HTML page (inline SVG charts, no network resources).
#pragma once

#include <string>

namespace aitune {

/// A page a user can open in a browser, from a tune report's JSON (`TuneReport::to_json`,
/// the tune_report.json a tune writes): the decision; per candidate its latency
/// distribution (min, p50, p90, p99, max against eager's p50) beside its accuracy against
/// eager per output (every field the report carries per output, whatever they are); the
/// accuracy-versus-latency frontier; where each failed candidate first diverges; the batch
/// search. Fields it does not know are shown as they are, so newer reports still render.
/// Error(kInvalidArgument) when `report_json` is not JSON or not a tune report (an object
/// with a "candidates" array).
std::string tune_report_html(const std::string& report_json);

}  // namespace aitune
