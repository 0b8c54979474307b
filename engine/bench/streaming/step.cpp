// A step's blocks and a layer's compute; the run's small helpers.
#include "streaming_bench.h"

#include <ATen/core/CachingHostAllocator.h>

#include <numeric>
#include <random>

#include "../bench_device.h"
#include "activekv/home_rows.h"

namespace activekv::streaming_bench {

void device_sync() { bench::sync_current_stream(g_device); }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::int64_t cdiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

std::string layer_name(std::int64_t l) { return "model.layers." + std::to_string(l) + ".self_attn.attn"; }

namespace {

// Block ids as --id-runs scatters them.
void scatter(std::vector<std::int64_t>& ids, std::uint32_t seed) {
  std::mt19937 rng(seed);
  if (g_id_runs <= 1) {
    std::shuffle(ids.begin(), ids.end(), rng);
    return;
  }
  std::vector<std::int64_t> starts;
  for (std::int64_t s = 0; s < static_cast<std::int64_t>(ids.size()); s += g_id_runs) starts.push_back(s);
  std::shuffle(starts.begin(), starts.end(), rng);
  std::size_t i = 0;
  for (const auto start : starts) {
    const std::int64_t end = std::min<std::int64_t>(start + g_id_runs, static_cast<std::int64_t>(ids.size()));
    for (std::int64_t id = end - 1; id >= start; --id) ids[i++] = id;
  }
}

// Home rows as the scheduler gives them (home_rows.h): the shared prefix
// first, then each sequence's blocks in prefill chunks of 2048 tokens, the
// sequences taking turns as a server's chunked prefills do.
std::unordered_map<std::int64_t, std::int64_t> extent_rows(
    const std::vector<std::vector<std::int64_t>>& tables, const std::vector<std::int64_t>& prefix,
    std::int64_t num_blocks) {
  HomeRows rows(num_blocks);
  rows.assign("prefix", prefix);
  constexpr std::size_t kChunk = 128;  // 2048 tokens of 16
  std::vector<std::size_t> given(tables.size(), prefix.size());
  for (bool more = true; more;) {
    more = false;
    for (std::size_t q = 0; q < tables.size(); ++q) {
      const auto& t = tables[q];
      const std::size_t end = std::min(t.size(), given[q] + kChunk);
      if (given[q] == end) continue;
      rows.assign("seq " + std::to_string(q),
                  std::vector<std::int64_t>(t.begin() + static_cast<long>(given[q]),
                                            t.begin() + static_cast<long>(end)));
      given[q] = end;
      more = true;
    }
  }
  std::unordered_map<std::int64_t, std::int64_t> row_of;
  for (const auto& t : tables)
    for (const auto b : t) row_of[b] = rows.row(b);
  return row_of;
}

}  // namespace

Step make_step(const StepShape& shape, std::int64_t block, std::int64_t num_blocks, std::uint32_t seed,
               Homes homes) {
  Step s;
  s.shape = shape;
  s.homes = homes;
  std::vector<std::int64_t> ids(static_cast<std::size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  if (!shape.contiguous) scatter(ids, seed);
  const std::int64_t per_seq = cdiv(shape.context, block);
  const std::int64_t shared = shape.shared_prefix / block;
  std::size_t next = 0;
  std::vector<std::int64_t> prefix(ids.begin(), ids.begin() + shared);
  next += static_cast<std::size_t>(shared);
  for (std::int64_t b = 0; b < shape.batch; ++b) {
    std::vector<std::int64_t> t = prefix;
    while (static_cast<std::int64_t>(t.size()) < per_seq) t.push_back(ids.at(next++));
    s.tables.push_back(std::move(t));
  }
  const std::int64_t first_new = shape.context - shape.new_tokens;
  // Blocks past the last one holding an earlier token are the step's new content.
  const auto first_fresh = static_cast<std::size_t>(cdiv(first_new, block));
  if (homes == Homes::kExtents) {
    s.row_of = extent_rows(s.tables, prefix, num_blocks);
  } else {
    for (const auto& t : s.tables)
      for (const auto b : t) s.row_of[b] = b;
  }
  std::set<std::int64_t> stage, wb;
  std::vector<std::int64_t> slot_block, slot_offset;
  for (const auto& t : s.tables) {
    const std::size_t staged = homes == Homes::kExtents ? std::min(first_fresh, t.size()) : t.size();
    stage.insert(t.begin(), t.begin() + static_cast<long>(staged));
    for (std::int64_t pos = first_new; pos < shape.context; ++pos) {
      const std::int64_t b = t[static_cast<std::size_t>(pos / block)];
      wb.insert(b);
      slot_block.push_back(b);
      slot_offset.push_back(pos % block);
    }
  }
  const auto by_row = [&](const std::set<std::int64_t>& blocks, std::vector<std::int64_t>& out_blocks,
                          std::vector<std::int64_t>& out_rows) {
    std::vector<std::pair<std::int64_t, std::int64_t>> pairs;
    for (const auto b : blocks) pairs.emplace_back(s.row_of.at(b), b);
    std::sort(pairs.begin(), pairs.end());
    for (const auto& [r, b] : pairs) out_blocks.push_back(b), out_rows.push_back(r);
  };
  by_row(stage, s.stage_blocks, s.stage_rows);
  by_row(wb, s.writeback_blocks, s.writeback_rows);
  std::int64_t runs = 0;
  for (std::size_t i = 0; i < s.stage_rows.size(); ++i) {
    if (i == 0 || s.stage_rows[i] != s.stage_rows[i - 1] + 1) ++runs;
    if (i == 0 || s.stage_rows[i] != s.stage_rows[i - 1] + 1 ||
        s.stage_blocks[i] != s.stage_blocks[i - 1] + 1) {
      ++s.copies;
    }
  }
  s.mean_run = runs == 0 ? 0 : static_cast<double>(s.stage_rows.size()) / static_cast<double>(runs);
  std::vector<std::int64_t> flat;
  for (const auto& t : s.tables) flat.insert(flat.end(), t.begin(), t.end());
  const auto dev = at::TensorOptions().device(g_device);
  s.table = at::tensor(flat, at::kLong).to(g_device);
  s.slot_block = at::tensor(slot_block, at::kLong).to(g_device);
  s.slot_offset = at::tensor(slot_offset, at::kLong).to(g_device);
  const std::int64_t n_new = shape.batch * shape.new_tokens;
  s.q = at::randn({shape.batch, kQueryHeads, shape.new_tokens, kHeadSize}, dev.dtype(at::kBFloat16));
  s.k_new = at::randn({n_new, kKvHeads, kHeadSize}, dev.dtype(at::kBFloat16));
  s.v_new = at::randn({n_new, kKvHeads, kHeadSize}, dev.dtype(at::kBFloat16));
  return s;
}

// One layer's compute on its KV cache [num_blocks, 2, block, heads, head]:
// the step's new K/V into their slots, then attention over the context.
at::Tensor layer_compute(const Step& s, at::Tensor& kv) {
  const at::Tensor zero = at::zeros_like(s.slot_block), one = at::ones_like(s.slot_block);
  kv.index_put_({s.slot_block, zero, s.slot_offset}, s.k_new);
  kv.index_put_({s.slot_block, one, s.slot_offset}, s.v_new);
  const std::int64_t b = s.shape.batch, ctx = s.shape.context;
  const std::int64_t per_seq = s.table.size(0) / b;
  auto side = [&](std::int64_t which) {
    return kv.select(1, which)
        .index_select(0, s.table)
        .view({b, per_seq * kv.size(2), kKvHeads, kHeadSize})
        .narrow(1, 0, ctx)
        .transpose(1, 2);
  };
  const std::int64_t group = kQueryHeads / kKvHeads;
  const at::Tensor q = s.q.view({b, kKvHeads, group * s.shape.new_tokens, kHeadSize});
  return at::scaled_dot_product_attention(q, side(0), side(1));
}

double pinned_peak(bool to_device, std::int64_t iters) {
  const std::int64_t big = std::int64_t{1} << 30;
  at::Tensor d = at::empty({big}, at::TensorOptions().device(g_device).dtype(at::kByte));
  at::Tensor h = at::empty({big}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  std::vector<double> t;
  for (std::int64_t i = 0; i <= iters; ++i) {
    device_sync();
    const auto t0 = std::chrono::steady_clock::now();
    if (to_device)
      d.copy_(h, true);
    else
      h.copy_(d, true);
    device_sync();
    if (i > 0) t.push_back(seconds_since(t0));
  }
  return static_cast<double>(big) / median(t);
}

void free_pinned_cache() {
  device_sync();
  at::getHostAllocator(g_device.type())->empty_cache();
}

}  // namespace activekv::streaming_bench
