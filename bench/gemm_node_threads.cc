// One many-rows float32 GEMM node (the custom-op route: W [K, N_i] read where it lies, packed per
// call, PackedTask) on 1 thread and on 2 threads in alternating turns: where a second thread loses
// (bench/README.md, "Two threads, session 18"). The tasks are the plan's for 2 threads (PlanTasks'
// fine-grained pass: all rows in one span, columns in RangeCols(n, COLS) ranges, largest first) or
// any other width; the threads claim them in order from one counter, as GemmInPlace does. Per turn:
// the wall time of each mode; for 2 threads also each thread's busy time (the sum of its tasks'
// wall times), its idle tail (the node's end minus its last task's end) and the mean task time
// against the same task on 1 thread (the cost of sharing L3 / memory with the other core).
//   I="-Ikernels -isystem $(grep -o '/[^ ]*ort-headers/[^ ]*' build/dev/build.ninja | head -1)"
//   g++ -O3 -DNDEBUG -ffp-contract=off -fno-math-errno -std=c++17 $I -mavx2 -mfma -mf16c -mavx512f
//       -DISA=avx512 -Wno-maybe-uninitialized -pthread bench/gemm_node_threads.cc -o /tmp/gemm_node_threads
//   /tmp/gemm_node_threads M K N1,N2,.. COLS TURNS     # e.g. 2048 2048 5632,5632 384 5
// Or, the tasks' code compiled alone as in the library (-DTREE_OBJECT; F as bench/gemm_ystore_micro.cc):
//   g++ $F $I -c bench/gemm_tree.cc -DTREE='"common/gemm_tiles.inc"' -DTREE_NS=avx512 -o /tmp/tree512.o
//   g++ $F $I -DISA=avx512 -DTREE_OBJECT -pthread bench/gemm_node_threads.cc /tmp/tree512.o -o /tmp/gemm_node_threads
// Knobs (environment): COLS2=c1,c2t3,..: more plans (columns c; "tN": the last 2 tasks split in
// column halves N times over, as common/gemm.cc's TaperTail with N = 3) run after the 1-/2-thread
// turns on 2 threads in rotated turns, each's median wall time, time ratio to the COLS plan, idle
// tail and busy sum printed; PLAN_THREADS=1: those plans on one thread; ONE=0: no 1-/2-thread
// turns; SAME=1: every task the first one (its W and Y hot); DEEP=1: deep in-place tasks (kDeepPlain); PIN=0: threads not pinned to CPUs
// (ORT does not pin). bench/README.md, "Two threads, session 18".
#if !defined(ISA)
#define ISA avx2
#endif
#if defined(TREE_OBJECT)
// The tasks' code from an object of its own (bench/gemm_tree.cc with TREE_NS=ISA), compiled as the
// library compiles gemm_tiles_<isa>.cc (in one unit with this file the compiler may inline it
// differently: bench/gemm_ystore_micro.cc). Either way this probe's W and Y are on 4 KiB pages of
// its own: its deep 512-row node ran 130-135 GFLOP/s on one thread where ORT's ran 146-150 (session 20).
#include "common/gemm.h"
namespace otfuse::gemm_detail::ISA {
void RunTask(const Job& job, const Task& task, float* stage, float* acc);
}
#else
#define OTFUSE_ISA_NAMESPACE ISA
#include "common/gemm_tiles.inc"
#undef OTFUSE_ISA_NAMESPACE
#endif

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

using namespace otfuse;
using namespace otfuse::gemm_detail;

#include "gemm_micro_common.h"

// taper > 0: the last 2 tasks split in column halves (whole 32-column tile pairs), `taper` times
// over, so that the last tasks claimed are small and the threads end close together.
static std::vector<Task> Plan(int64_t m, const std::vector<int64_t>& widths, int64_t cols, int taper = 0) {
  std::vector<Task> tasks;
  // DEEP=1: W read deep in place (kDeepPlain, the plan of 97-576 rows) instead of packed per call.
  const bool deep = std::getenv("DEEP") != nullptr && std::atoi(std::getenv("DEEP")) != 0;
  for (size_t i = 0; i < widths.size(); ++i) {
    const int64_t n = widths[i];
    const int64_t range = RangeCols(n, cols);
    for (int64_t c0 = 0; c0 < n; c0 += range) {
      tasks.push_back(Task{static_cast<int64_t>(i), deep ? TaskKind::kDeepPlain : TaskKind::kPacked, 0, m, c0,
                           std::min(range, n - c0)});
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& a, const Task& b) { return a.rows * a.cols > b.rows * b.cols; });
  if (std::getenv("SAME") != nullptr) {  // SAME=1: every task the first one (its W and Y hot)
    for (Task& t : tasks) t = tasks[0];
  }
  for (int level = 0; level < taper && tasks.size() >= 2; ++level) {
    std::vector<Task> last(tasks.end() - 2, tasks.end());
    tasks.resize(tasks.size() - 2);
    for (const Task& t : last) {
      const int64_t half = (t.cols / 2 + 31) / 32 * 32;
      if (half >= t.cols) {
        tasks.push_back(t);
        continue;
      }
      Task a = t, b = t;
      a.cols = half;
      b.col0 = t.col0 + half;
      b.cols = t.cols - half;
      tasks.push_back(a);
      tasks.push_back(b);
    }
    std::stable_sort(tasks.begin(), tasks.end(),
                     [](const Task& a, const Task& b) { return a.rows * a.cols > b.rows * b.cols; });
  }
  return tasks;
}

struct Record {
  double start, end;
};

struct Run {
  double wall;
  std::vector<Record> tasks;  // per task (plan order)
  std::vector<int> owner;     // per task: the thread that ran it
};

static void Pin(int cpu) {
  if (std::getenv("PIN") != nullptr && std::atoi(std::getenv("PIN")) == 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

// Per thread: busy time (the sum of its tasks' wall times); tail: how long the first thread done
// waited for the other (the node's end minus the earlier of the threads' last ends).
struct Split {
  double busy[2] = {0, 0};
  double tail = 0;
};

struct Run;
static Split SplitOf(const Run& run, size_t count);

static Run RunNode(const Job& job, const std::vector<Task>& tasks, int threads, std::vector<std::vector<float>>& buffers) {
  Run run;
  run.tasks.resize(tasks.size());
  run.owner.resize(tasks.size());
  std::atomic<size_t> next{0};
  std::atomic<int> ready{0};
  double t0 = 0;
  auto work = [&](int id) {
    Pin(id);
    ready.fetch_add(1);
    while (ready.load() < threads) {
    }
    for (;;) {
      const size_t i = next.fetch_add(1);
      if (i >= tasks.size()) break;
      const double s = WallNow();
      ISA::RunTask(job, tasks[i], buffers[id].data(), buffers[id].data() + kStageFloats);
      run.tasks[i] = Record{s, WallNow()};
      run.owner[i] = id;
    }
  };
  t0 = WallNow();
  std::vector<std::thread> pool;
  for (int id = 1; id < threads; ++id) pool.emplace_back(work, id);
  work(0);
  for (auto& t : pool) t.join();
  const double t1 = WallNow();
  // Thread start-up is not the node's: the wall time from the first task's start.
  double first = t1;
  for (const Record& r : run.tasks) first = std::min(first, r.start);
  run.wall = t1 - first;
  (void)t0;
  return run;
}

static Split SplitOf(const Run& run, size_t count) {
  Split s;
  double last_end[2] = {0, 0}, end = 0;
  for (size_t i = 0; i < count; ++i) {
    const Record& r = run.tasks[i];
    s.busy[run.owner[i]] += r.end - r.start;
    last_end[run.owner[i]] = std::max(last_end[run.owner[i]], r.end);
    end = std::max(end, r.end);
  }
  s.tail = end - std::min(last_end[0], last_end[1]);
  return s;
}

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s M K N1,N2,.. COLS TURNS\n", argv[0]);
    return 2;
  }
  const int64_t m = std::atoll(argv[1]), k = std::atoll(argv[2]);
  std::vector<int64_t> widths;
  for (char* s = std::strtok(argv[3], ","); s != nullptr; s = std::strtok(nullptr, ",")) widths.push_back(std::atoll(s));
  const int64_t cols = std::atoll(argv[4]);
  const int turns = std::atoi(argv[5]);
  std::vector<int64_t> others;  // COLS2=c1,c2,..: more plans, 2 threads, in the same turns (cT: tapered T times)
  if (std::getenv("COLS2") != nullptr) {
    std::string list = std::getenv("COLS2");
    for (char* s = std::strtok(list.data(), ","); s != nullptr; s = std::strtok(nullptr, ",")) others.push_back(std::atoll(s));
  }

  std::vector<float> a(m * k);
  for (int64_t i = 0; i < m * k; ++i) a[i] = static_cast<float>(i % 7) * 0.1f;
  const std::vector<float> a_packed = PackRowBlocks(a, m, k);  // row blocks of 6, [k][rows] each
  std::vector<std::vector<float>> ws, ys;
  std::vector<GemmProduct> products;
  int64_t total_n = 0;
  for (int64_t n : widths) {
    ws.emplace_back(k * n);
    for (int64_t i = 0; i < k * n; ++i) ws.back()[i] = static_cast<float>(i % 5) * 0.01f;
    ys.emplace_back(m * n);
    products.push_back(GemmProduct{ws.back().data(), WeightType::kFloat32, false, n, nullptr, ys.back().data()});
    total_n += n;
  }
  const Job job{m, k, a_packed.data(), products.data(), a.data(), nullptr};
  const std::vector<Task> plan = Plan(m, widths, cols);
  std::vector<std::vector<Task>> plans{plan};
  std::vector<int> tapers;
  if (std::getenv("COLS2") != nullptr) {
    std::string list = std::getenv("COLS2");
    for (char* s = std::strtok(list.data(), ","); s != nullptr; s = std::strtok(nullptr, ",")) {
      const char* t = std::strchr(s, 't');
      tapers.push_back(t != nullptr ? std::atoi(t + 1) : 0);
    }
  }
  for (size_t i = 0; i < others.size(); ++i) plans.push_back(Plan(m, widths, others[i], tapers[i]));
  int64_t max_cells = 0;
  for (const auto& p : plans) {
    for (const Task& t : p) max_cells = std::max(max_cells, t.rows * ((t.cols + 15) / 16 * 16));
  }
  std::vector<std::vector<float>> buffers(2, std::vector<float>(kStageFloats + max_cells));
  const double flop = 2.0 * m * k * total_n;
  std::printf("M %lld K %lld N_total %lld, %zu tasks of <= %lld columns; other plans:", (long long)m, (long long)k,
              (long long)total_n, plan.size(), (long long)cols);
  for (size_t i = 1; i < plans.size(); ++i) std::printf(" %zu tasks of <= %lld (taper %d)", plans[i].size(), (long long)others[i - 1], tapers[i - 1]);
  std::printf("\n");
  RunNode(job, plan, 2, buffers);  // warm-up: pages touched, clocks up
  const bool with_one = std::getenv("ONE") == nullptr || std::atoi(std::getenv("ONE")) != 0;
  for (int turn = 0; turn < turns && with_one; ++turn) {
    const Run one = RunNode(job, plan, 1, buffers);
    const Run two = RunNode(job, plan, 2, buffers);
    const Split s = SplitOf(two, plan.size());
    double task_ratio = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
      task_ratio += (two.tasks[i].end - two.tasks[i].start) / (one.tasks[i].end - one.tasks[i].start);
    }
    task_ratio /= plan.size();
    std::printf("turn %d: 1t %.1f ms %.0f GFLOP/s | 2t %.1f ms %.0f GFLOP/s (speed-up %.3f) busy %.1f / %.1f ms, "
                "idle tail %.1f ms, task time 2t/1t %.3f\n",
                turn, one.wall * 1e3, flop / one.wall * 1e-9, two.wall * 1e3, flop / two.wall * 1e-9,
                one.wall / two.wall, s.busy[0] * 1e3, s.busy[1] * 1e3, s.tail * 1e3, task_ratio);
    std::fflush(stdout);
  }
  // PLAN_THREADS=1: the plans on 1 thread instead (the per-task cost without the other core).
  const int plan_threads = std::getenv("PLAN_THREADS") != nullptr ? std::atoi(std::getenv("PLAN_THREADS")) : 2;
  // The plans on 2 threads, each turn in a rotated order (no plan always in the same slot).
  std::vector<std::vector<double>> walls(plans.size()), tails(plans.size()), busies(plans.size());
  for (int turn = 0; turn < turns && plans.size() > 1; ++turn) {
    for (size_t slot = 0; slot < plans.size(); ++slot) {
      const size_t p = (slot + turn) % plans.size();
      const Run run = RunNode(job, plans[p], plan_threads, buffers);
      const Split s = SplitOf(run, plans[p].size());
      walls[p].push_back(run.wall);
      tails[p].push_back(s.tail);
      busies[p].push_back(s.busy[0] + s.busy[1]);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  for (size_t p = 0; p < plans.size() && plans.size() > 1; ++p) {
    std::vector<double> ratio;
    for (size_t t = 0; t < walls[p].size(); ++t) ratio.push_back(walls[0][t] / walls[p][t]);
    std::printf("plan %lld columns taper %d (%zu tasks): wall %.1f ms (%.0f GFLOP/s), time ratio plan 0 / it %.3f, "
                "idle tail %.1f ms, busy sum %.1f ms\n",
                (long long)(p == 0 ? cols : others[p - 1]), p == 0 ? 0 : tapers[p - 1], plans[p].size(),
                median(walls[p]) * 1e3, flop / median(walls[p]) * 1e-9, median(ratio), median(tails[p]) * 1e3,
                median(busies[p]) * 1e3);
  }
  return 0;
}
