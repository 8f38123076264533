// SPDX-License-Identifier: Apache-2.0
// strata-schedule: a pipeline schedule as a timeline, from its lists alone (no model runs).
//
//   strata-schedule --schedule 1f1b --stages 4 --micro-batches 8
//   strata-schedule --schedule interleaved_1f1b --chunks 2 --stages 4 --micro-batches 8
//   strata-schedule --schedule zero_bubble_h1 --stages 4 --micro-batches 8 --png zb.png
//   strata-schedule --schedule gpipe --stages 2 --micro-batches 3 --list
//
// Prints the text timeline (the simulated run: each pass at its time, "." idle), the bubble
// against the textbook value, and each stage's peak activations in flight; --list prints each
// rank's actions; --png draws the timeline with matplotlib (python3 with matplotlib must be on
// the machine; the interpreter is $STRATA_PYTHON, else python3, else /usr/bin/python3).
// Pass times: --forward, --backward (B; a whole backward is B + W) and --weight (W), in any
// unit; --transfer for the time a send takes to arrive.

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "strata/pipeline.hpp"

namespace sp = strata::pipeline;

namespace {

struct options {
  std::string schedule = "one_f_one_b";
  int stages = 4;
  int micro_batches = 8;
  int chunks = 2;
  sp::action_times times{};
  bool list = false;
  std::string png{};
};

// The schedule's lists and its textbook bubble (negative: none to compare with).
struct made {
  sp::schedule_lists lists;
  double theory = -1.0;
  std::string title;
};

template <class S>
made make(const options& o) {
  made out{.lists = S{}.lists(sp::shape_for<S>(o.stages, o.micro_batches)),
           .theory = -1.0,
           .title = std::string(S::name)};
  const double p = o.stages;
  const double m = o.micro_batches;
  const sp::action_times& t = o.times;
  if constexpr (S::chunks > 1) {
    out.title += " v=" + std::to_string(S::chunks);
    if (o.micro_batches % o.stages == 0) {
      out.theory = (p - 1) / (S::chunks * m + p - 1);
    }
  } else if constexpr (S::splits_backward) {
    if (t.forward == t.backward_input && t.forward == t.backward_weight) {
      out.theory = (p - 1) / (3 * m + p - 1);
    }
  } else {
    out.theory = (p - 1) / (m + p - 1);
  }
  return out;
}

made make_for(const options& o) {
  if (o.schedule == "gpipe") {
    return make<sp::gpipe>(o);
  }
  if (o.schedule == "1f1b" || o.schedule == "one_f_one_b") {
    return make<sp::one_f_one_b>(o);
  }
  if (o.schedule == "zero_bubble_h1" || o.schedule == "zb_h1") {
    return make<sp::zero_bubble_h1>(o);
  }
  if (o.schedule == "interleaved_1f1b") {
    switch (o.chunks) {
      case 2:
        return make<sp::interleaved_1f1b<2>>(o);
      case 3:
        return make<sp::interleaved_1f1b<3>>(o);
      case 4:
        return make<sp::interleaved_1f1b<4>>(o);
      default:
        throw std::invalid_argument("--chunks " + std::to_string(o.chunks) +
                                    ": this program has interleaved_1f1b for 2, 3 and 4 chunks");
    }
  }
  throw std::invalid_argument(
      "--schedule " + o.schedule +
      ": not one of gpipe, one_f_one_b (1f1b), interleaved_1f1b, zero_bubble_h1");
}

// The interpreter that has matplotlib, or empty.
std::string python_with_matplotlib() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("STRATA_PYTHON"); env != nullptr && *env != '\0') {
    candidates.emplace_back(env);
  }
  candidates.emplace_back("python3");
  candidates.emplace_back("/usr/bin/python3");
  for (const std::string& py : candidates) {
    const std::string probe = py + " -c 'import matplotlib' >/dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) {
      return py;
    }
  }
  return {};
}

// Draws the run's passes as bars per rank into `png` with matplotlib.
int draw_png(const made& m, const sp::simulation& run, const std::string& png) {
  const std::string py = python_with_matplotlib();
  if (py.empty()) {
    std::fprintf(stderr,
                 "strata-schedule: --png needs python3 with matplotlib (Debian: apt-get install "
                 "python3-matplotlib; or set STRATA_PYTHON to an interpreter that has it); the "
                 "text timeline is above\n");
    return 3;
  }
  nlohmann::json data;
  data["title"] = m.title;
  data["stages"] = m.lists.shape.stages;
  data["png"] = png;
  for (const sp::timed_action& t : run.passes) {
    data["passes"].push_back({{"rank", t.rank},
                              {"label", sp::pass_label(t.what)},
                              {"kind", sp::to_string(t.what.kind)},
                              {"begin", t.begin},
                              {"end", t.end}});
  }
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  const std::filesystem::path json =
      dir / ("strata_schedule_" + std::to_string(::getpid()) + ".json");
  const std::filesystem::path script =
      dir / ("strata_schedule_" + std::to_string(::getpid()) + ".py");
  std::ofstream(json) << data.dump();
  std::ofstream(script) << R"(import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
d = json.load(open(sys.argv[1]))
colors = {"forward": "#4c72b0", "backward": "#dd8452", "backward_input": "#dd8452",
          "backward_weight": "#55a868"}
fig, ax = plt.subplots(figsize=(max(6, len(d["passes"]) / d["stages"] * 0.45), 0.6 * d["stages"] + 1))
for p in d["passes"]:
    ax.broken_barh([(p["begin"], p["end"] - p["begin"])], (p["rank"] - 0.4, 0.8),
                   facecolors=colors[p["kind"]], edgecolor="white")
    ax.text((p["begin"] + p["end"]) / 2, p["rank"], p["label"], ha="center", va="center",
            fontsize=7, color="white")
ax.set_yticks(range(d["stages"]))
ax.set_yticklabels(["rank %d" % r for r in range(d["stages"])])
ax.invert_yaxis()
ax.set_xlabel("time")
ax.set_title(d["title"])
fig.tight_layout()
fig.savefig(d["png"], dpi=120)
)";
  const std::string command = py + " '" + script.string() + "' '" + json.string() + "'";
  const int rc = std::system(command.c_str());
  std::filesystem::remove(json);
  std::filesystem::remove(script);
  if (rc != 0) {
    std::fprintf(stderr, "strata-schedule: drawing %s failed\n", png.c_str());
    return 1;
  }
  std::printf("timeline drawn in %s\n", png.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app("strata-schedule: a pipeline schedule's timeline from its lists");
  app.add_option("--schedule", o.schedule,
                 "gpipe, one_f_one_b (1f1b), interleaved_1f1b or zero_bubble_h1")
      ->capture_default_str();
  app.add_option("--stages,-p", o.stages, "pipeline stages (ranks)")->capture_default_str();
  app.add_option("--micro-batches,-m", o.micro_batches, "micro-batches per step")
      ->capture_default_str();
  app.add_option("--chunks,-v", o.chunks, "interleaved_1f1b: model chunks per rank (2, 3, 4)")
      ->capture_default_str();
  app.add_option("--forward", o.times.forward, "time of a forward pass")->capture_default_str();
  app.add_option("--backward", o.times.backward_input, "time of the input-gradient pass B")
      ->capture_default_str();
  app.add_option("--weight", o.times.backward_weight, "time of the weight-gradient pass W")
      ->capture_default_str();
  app.add_option("--transfer", o.times.transfer, "time from a send to its arrival")
      ->capture_default_str();
  app.add_flag("--list", o.list, "print each rank's actions");
  app.add_option("--png", o.png, "draw the timeline into this PNG (needs matplotlib)");
  CLI11_PARSE(app, argc, argv);
  try {
    const made m = make_for(o);
    const sp::simulation run = sp::simulate(m.lists, o.times);
    if (run.deadlocked) {
      std::fprintf(stderr, "strata-schedule: the lists deadlock: %s\n", run.stuck.c_str());
      return 1;
    }
    std::fputs(sp::text_timeline(m.title, m.lists.shape, run).c_str(), stdout);
    if (m.theory >= 0.0) {
      std::printf("bubble %.4f, textbook %.4f\n", run.bubble(), m.theory);
    } else {
      std::printf("bubble %.4f\n", run.bubble());
    }
    std::printf("peak micro-batches in flight per rank:");
    for (int peak : run.peak_in_flight) {
      std::printf(" %d", peak);
    }
    std::printf("\n");
    if (o.list) {
      for (std::size_t r = 0; r < m.lists.ranks.size(); ++r) {
        std::printf("rank %zu:", r);
        for (const sp::action& a : m.lists.ranks[r]) {
          std::printf(" [%s]", sp::to_string(a).c_str());
        }
        std::printf("\n");
      }
    }
    if (!o.png.empty()) {
      return draw_png(m, run, o.png);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata-schedule: %s\n", e.what());
    return 2;
  }
  return 0;
}
