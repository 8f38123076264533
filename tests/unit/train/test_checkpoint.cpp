// SPDX-License-Identifier: Apache-2.0
#include "strata/train/checkpoint.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/data/loader_fault.hpp"
#include "strata/train/gradient_fault.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using strata::checkpoint_error;
using strata::train::checkpoint_blob;
using strata::train::checkpoint_config;
using strata::train::checkpoint_file_record;
using strata::train::checkpoint_info;
using strata::train::checkpoint_position;
using strata::train::checkpoint_store;
using strata::train::loaded_checkpoint;

fs::path fresh_dir(std::string_view name) {
  const fs::path dir = fs::path(STRATA_TEST_WORK_DIR) / "checkpoint" / name;
  fs::remove_all(dir);
  fs::create_directories(dir.parent_path());
  return dir;
}

std::vector<std::byte> payload(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> out(n);
  std::uint64_t x = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (std::byte& b : out) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    b = static_cast<std::byte>(x >> 56U);
  }
  return out;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_text(const fs::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
}

std::string hex(std::uint64_t v) {
  char text[32] = {};
  std::snprintf(text, sizeof(text), "0x%016llx", static_cast<unsigned long long>(v));
  return text;
}

std::uint64_t xxh3(const std::vector<std::byte>& bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

template <class F>
std::optional<checkpoint_error> error_of(F&& f) {
  try {
    f();
  } catch (const checkpoint_error& e) {
    return e;
  }
  return std::nullopt;
}

// The files and state a test checkpoint at `p` holds.
struct sample {
  std::vector<std::byte> params{};
  std::vector<std::byte> optimizer{};
  json state{};

  explicit sample(checkpoint_position p)
      : params(payload(64, p.epoch * 1000 + p.step)),
        optimizer(payload(48, p.epoch * 1000 + p.step + 500)),
        state({{"global_step", p.epoch * 100 + p.step}, {"loss_scaler", nullptr}}) {}

  std::vector<checkpoint_blob> blobs() const {
    return {{.name = "rank-0.params.bin", .bytes = params},
            {.name = "rank-0.optimizer.bin", .bytes = optimizer}};
  }
};

checkpoint_info save_sample(checkpoint_store& store, checkpoint_position p) {
  const sample s(p);
  return store.save(p, s.state, s.blobs());
}

// The loaded checkpoint is the one save_sample wrote at `p`.
void check_sample(const loaded_checkpoint& c, checkpoint_position p) {
  const sample s(p);
  CHECK(c.info.position == p);
  CHECK(c.state == s.state);
  CHECK(c.blob("rank-0.params.bin") == s.params);
  CHECK(c.blob("rank-0.optimizer.bin") == s.optimizer);
}

// A fresh copy of a directory holding epoch-1 and epoch-2 of save_sample (saved once per run: the
// fsyncs of a save dominate the run time of these tests).
fs::path two_checkpoints(std::string_view name) {
  static const fs::path source = [] {
    const fs::path d = fresh_dir("two_checkpoints");
    checkpoint_store s({.dir = d, .keep = 3});
    save_sample(s, {.epoch = 1, .step = 0});
    save_sample(s, {.epoch = 2, .step = 0});
    return d;
  }();
  const fs::path dir = fresh_dir(name);
  fs::copy(source, dir, fs::copy_options::recursive);
  return dir;
}

std::vector<std::string> names(const checkpoint_store& store) {
  std::vector<std::string> out;
  for (const checkpoint_info& c : store.list()) {
    out.push_back(c.name);
  }
  return out;
}

// Entries of `dir` whose names start with '.'.
std::vector<std::string> hidden_entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with(".")) {
      out.push_back(name);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("checkpoint names encode (epoch, step) and parse back only in canonical form") {
  using strata::train::checkpoint_name;
  using strata::train::parse_checkpoint_name;
  CHECK(checkpoint_name({.epoch = 3, .step = 0}) == "epoch-3");
  CHECK(checkpoint_name({.epoch = 3, .step = 50}) == "epoch-3-step-50");
  for (const checkpoint_position p :
       {checkpoint_position{0, 0}, checkpoint_position{0, 7}, checkpoint_position{12, 0},
        checkpoint_position{12, 345}, checkpoint_position{UINT64_MAX, UINT64_MAX}}) {
    CHECK(parse_checkpoint_name(checkpoint_name(p)) == p);
  }
  for (const std::string_view bad :
       {"", "epoch-", "epoch-03", "epoch-3-step-0", "epoch-3-step-", "epoch-3-step-05", "epoch--3",
        "epoch-+3", "epoch-3x", ".tmp-epoch-3-12", "epoch-18446744073709551616",
        "epoch-3-step-4-step-5", "Epoch-3", "latest", "epoch-3 "}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_checkpoint_name(bad).has_value());
  }

  using strata::train::is_checkpoint_file_name;
  CHECK(is_checkpoint_file_name("rank-0.params.bin"));
  CHECK(is_checkpoint_file_name("A_b-9"));
  for (const std::string_view bad :
       {"", "a/b", ".hidden", "..", ".", "manifest.json", "a b", "a\\b", "caf\xc3\xa9"}) {
    CAPTURE(bad);
    CHECK_FALSE(is_checkpoint_file_name(bad));
  }
  CHECK(is_checkpoint_file_name(std::string(255, 'x')));
  CHECK_FALSE(is_checkpoint_file_name(std::string(256, 'x')));
}

TEST_CASE("checkpoint_config is validated and printable") {
  CHECK_THROWS_AS(checkpoint_store(checkpoint_config{.dir = "x", .keep = 0}),
                  std::invalid_argument);
  CHECK_THROWS_AS(checkpoint_store(checkpoint_config{}), std::invalid_argument);
  const checkpoint_config c{.dir = "ckpt", .keep = 5, .config_hash = "h1"};
  CHECK(to_string(c) == R"(checkpoint_config{.dir = "ckpt", .keep = 5, .config_hash = "h1"})");
  CHECK(checkpoint_store(c).config() == c);
  CHECK(checkpoint_store(checkpoint_config{.dir = "a/b/"}).config().dir == fs::path("a/b"));

  CHECK(to_string(checkpoint_position{.epoch = 2, .step = 9}) ==
        "checkpoint_position{.epoch = 2, .step = 9}");
  CHECK(to_string(checkpoint_file_record{.name = "f", .size = 3, .xxh3 = 0xabcU}) ==
        R"(checkpoint_file_record{.name = "f", .size = 3, .xxh3 = 0x0000000000000abc})");
  const std::vector<std::byte> bytes = payload(5, 1);
  CHECK(to_string(checkpoint_blob{.name = "f", .bytes = bytes}) ==
        R"(checkpoint_blob{.name = "f", .bytes = <5 bytes>})");
}

TEST_CASE("save and load round-trip the files, the state and the manifest") {
  const fs::path dir = fresh_dir("round_trip");
  checkpoint_store store({.dir = dir, .keep = 3, .config_hash = "cfg-abc"});

  const std::vector<float> params = {1.5F, -2.25F, 3.0F, 1e-7F, -0.0F};
  const std::vector<std::byte> optimizer = payload(1000, 42);
  const std::vector<std::byte> empty;
  const std::vector<checkpoint_blob> blobs = {
      {.name = "rank-0.params.bin", .bytes = std::as_bytes(std::span(params))},
      {.name = "rank-0.optimizer.bin", .bytes = optimizer},
      {.name = "rank-0.empty.bin", .bytes = empty}};
  const json state = {{"world", {{"size", 1}, {"layout", "data_parallel"}}},
                      {"global_step", 1234},
                      {"sampler", {{"epoch", 2}, {"position", 0}}},
                      {"rng", {{"stream", "0123456789abcdef"}, {"counter", 77}}},
                      {"lr_schedule", {{"step", 1234}, {"value", 0.05}}},
                      {"loss_scaler", nullptr}};

  const checkpoint_info info = store.save({.epoch = 2, .step = 0}, state, blobs);
  CHECK(info == checkpoint_info{.name = "epoch-2", .path = dir / "epoch-2", .position = {2, 0}});
  CHECK(read_text(dir / "latest") == "epoch-2\n");
  CHECK(hidden_entries(dir).empty());

  const loaded_checkpoint c = store.load(info.path);
  CHECK(c.info == info);
  CHECK(c.format_version == 1);
  CHECK(c.config_hash == "cfg-abc");
  CHECK(c.state == state);
  REQUIRE(c.files.size() == 3);
  const std::vector<std::byte> params_bytes(std::as_bytes(std::span(params)).begin(),
                                            std::as_bytes(std::span(params)).end());
  CHECK(c.files[0] == checkpoint_file_record{.name = "rank-0.params.bin",
                                             .size = params_bytes.size(),
                                             .xxh3 = xxh3(params_bytes)});
  CHECK(c.files[1] == checkpoint_file_record{
                          .name = "rank-0.optimizer.bin", .size = 1000, .xxh3 = xxh3(optimizer)});
  CHECK(c.files[2].size == 0);
  CHECK(c.blob("rank-0.optimizer.bin") == optimizer);
  CHECK(c.blob("rank-0.empty.bin").empty());

  std::vector<float> restored(params.size());
  c.copy_blob("rank-0.params.bin", std::span(restored));
  CHECK(restored == params);
  std::vector<float> too_small(params.size() - 1);
  const auto size_error = error_of([&] { c.copy_blob("rank-0.params.bin", std::span(too_small)); });
  REQUIRE(size_error);
  CHECK(size_error->check() == "size");
  CHECK(std::string(size_error->what()).find("the file has 20 bytes, the destination 16") !=
        std::string::npos);
  const auto missing = error_of([&] { (void)c.blob("rank-1.params.bin"); });
  REQUIRE(missing);
  CHECK(missing->check() == "missing file");
  CHECK(missing->path() == (info.path / "rank-1.params.bin").string());

  const json manifest = json::parse(read_text(info.path / "manifest.json"));
  CHECK(manifest["format_version"] == 1);
  CHECK(manifest["name"] == "epoch-2");
  CHECK(manifest["epoch"] == 2);
  CHECK(manifest["step"] == 0);
  CHECK(manifest["config_hash"] == "cfg-abc");
  CHECK(manifest["state"] == state);
  CHECK(manifest["state"]["loss_scaler"].is_null());
  CHECK(manifest["files"][1] ==
        json{{"name", "rank-0.optimizer.bin"}, {"size", 1000}, {"xxh3", hex(xxh3(optimizer))}});
  const std::string saved_at = manifest["saved_at"];
  CHECK(saved_at == c.saved_at);
  CHECK(saved_at.size() == 20);
  CHECK(saved_at.back() == 'Z');

  std::vector<checkpoint_error> skipped;
  const std::optional<loaded_checkpoint> latest = store.load_latest(&skipped);
  REQUIRE(latest);
  CHECK(*latest == c);
  CHECK(skipped.empty());
  CHECK_NOTHROW(strata::train::check_config_hash(c, "cfg-abc"));

  CHECK(to_string(info) == "checkpoint_info{.name = \"epoch-2\", .path = \"" +
                               (dir / "epoch-2").string() +
                               "\", .position = checkpoint_position{.epoch = 2, .step = 0}}");
  const std::string printed = to_string(c);
  CHECK(printed.starts_with("loaded_checkpoint{.info = checkpoint_info{.name = \"epoch-2\""));
  CHECK(printed.find(".format_version = 1, .config_hash = \"cfg-abc\"") != std::string::npos);
  CHECK(printed.ends_with(".state = " + state.dump() + ", .blobs = <3 files>}"));
}

TEST_CASE("keep removes the oldest checkpoints and latest names the newest") {
  const fs::path dir = fresh_dir("keep");
  checkpoint_store store({.dir = dir, .keep = 2});
  for (std::uint64_t epoch = 1; epoch <= 4; ++epoch) {
    save_sample(store, {.epoch = epoch, .step = 0});
    CHECK(read_text(dir / "latest") == "epoch-" + std::to_string(epoch) + "\n");
  }
  CHECK(names(store) == std::vector<std::string>{"epoch-3", "epoch-4"});
  CHECK_FALSE(fs::exists(dir / "epoch-1"));
  CHECK_FALSE(fs::exists(dir / "epoch-2"));
  CHECK(hidden_entries(dir).empty());
  const auto latest = store.load_latest();
  REQUIRE(latest);
  CHECK(latest->info.name == "epoch-4");
  check_sample(*latest, {.epoch = 4, .step = 0});
}

TEST_CASE("checkpoints order by (epoch, step), not by the text of their names") {
  const fs::path dir = fresh_dir("order");
  checkpoint_store store({.dir = dir, .keep = 10});
  for (const checkpoint_position p :
       {checkpoint_position{10, 0}, checkpoint_position{9, 0}, checkpoint_position{1, 50},
        checkpoint_position{1, 7}, checkpoint_position{1, 0}, checkpoint_position{0, 3},
        checkpoint_position{2, 0}}) {
    save_sample(store, p);
  }
  CHECK(names(store) == std::vector<std::string>{"epoch-0-step-3", "epoch-1", "epoch-1-step-7",
                                                 "epoch-1-step-50", "epoch-2", "epoch-9",
                                                 "epoch-10"});
  // `latest` names the last save; without it the newest position wins.
  CHECK(store.load_latest()->info.name == "epoch-2");
  fs::remove(dir / "latest");
  std::vector<checkpoint_error> skipped;
  const auto newest = store.load_latest(&skipped);
  REQUIRE(newest);
  CHECK(newest->info.name == "epoch-10");
  CHECK(skipped.empty());

  // Pruning goes oldest first and spares the checkpoint just written even when it is not among
  // the newest.
  checkpoint_store keep3({.dir = dir, .keep = 3});
  save_sample(keep3, {.epoch = 1, .step = 60});
  CHECK(names(keep3) == std::vector<std::string>{"epoch-1-step-60", "epoch-9", "epoch-10"});
}

TEST_CASE("a torn or corrupt newest checkpoint is skipped, naming the file and the check") {
  const fs::path dir = two_checkpoints("torn");
  checkpoint_store store({.dir = dir, .keep = 3});
  const fs::path d2 = dir / "epoch-2";

  fs::path bad_file;
  std::string check;
  std::string text;
  SUBCASE("missing shard") {
    bad_file = d2 / "rank-0.params.bin";
    fs::remove(bad_file);
    check = "missing file";
    text = "missing file rank-0.params.bin";
  }
  SUBCASE("truncated shard") {
    bad_file = d2 / "rank-0.params.bin";
    fs::resize_file(bad_file, 10);
    check = "size";
    text = "size mismatch in rank-0.params.bin: manifest 64 bytes, file 10 bytes";
  }
  SUBCASE("flipped byte") {
    bad_file = d2 / "rank-0.optimizer.bin";
    std::string bytes = read_text(bad_file);
    bytes[17] = static_cast<char>(bytes[17] ^ 0x10);
    write_text(bad_file, bytes);
    check = "xxh3";
    text = "xxh3 mismatch in rank-0.optimizer.bin: manifest " +
           hex(xxh3(sample({2, 0}).optimizer)) + ", file 0x";
  }
  SUBCASE("corrupt manifest JSON") {
    bad_file = d2 / "manifest.json";
    const std::string manifest = read_text(bad_file);
    write_text(bad_file, manifest.substr(0, 40));
    check = "manifest parse";
    text = "manifest.json: parse error at byte 41";
  }
  SUBCASE("manifest number beyond double") {
    bad_file = d2 / "manifest.json";
    write_text(bad_file, "1e702");
    check = "manifest parse";
    text = "manifest.json: number overflow parsing '1e702'";
  }
  SUBCASE("unknown format version") {
    bad_file = d2 / "manifest.json";
    json manifest = json::parse(read_text(bad_file));
    manifest["format_version"] = 7;
    write_text(bad_file, manifest.dump());
    check = "format version";
    text = "unknown format version 7";
  }
  SUBCASE("missing manifest") {
    bad_file = d2 / "manifest.json";
    fs::remove(bad_file);
    check = "missing file";
    text = "missing file manifest.json";
  }
  SUBCASE("manifest field of the wrong type") {
    bad_file = d2 / "manifest.json";
    json manifest = json::parse(read_text(bad_file));
    manifest["files"][0]["size"] = "64";
    write_text(bad_file, manifest.dump());
    check = "manifest schema";
    text = "manifest.json: files[0] is not";
  }
  SUBCASE("manifest listing an unsafe file name") {
    bad_file = d2 / "manifest.json";
    json manifest = json::parse(read_text(bad_file));
    manifest["files"][0]["name"] = "../epoch-1/rank-0.params.bin";
    write_text(bad_file, manifest.dump());
    check = "manifest schema";
    text = "is not a checkpoint file name";
  }

  const auto direct = error_of([&] { (void)store.load(d2); });
  REQUIRE(direct);
  CHECK(direct->check() == check);

  std::vector<checkpoint_error> skipped;
  const auto c = store.load_latest(&skipped);
  REQUIRE(c);
  check_sample(*c, {.epoch = 1, .step = 0});
  REQUIRE(skipped.size() == 1);
  CHECK(skipped[0].path() == bad_file.string());
  CHECK(skipped[0].check() == check);
  CAPTURE(skipped[0].what());
  CHECK(std::string(skipped[0].what()).find(text) != std::string::npos);
}

TEST_CASE("leftover staging directories and a dangling latest are ignored") {
  const fs::path dir = two_checkpoints("leftovers");
  checkpoint_store store({.dir = dir, .keep = 3});
  fs::create_directories(dir / ".tmp-epoch-3-999");
  write_text(dir / ".tmp-epoch-3-999" / "rank-0.params.bin", "partial");
  fs::create_directories(dir / ".old-epoch-2-5");
  fs::create_directories(dir / "epoch-03");

  CHECK(names(store) == std::vector<std::string>{"epoch-1", "epoch-2"});
  std::vector<checkpoint_error> skipped;
  CHECK(store.load_latest(&skipped)->info.name == "epoch-2");
  CHECK(skipped.empty());

  SUBCASE("latest names a missing checkpoint") {
    write_text(dir / "latest", "epoch-7\n");
    const auto c = store.load_latest(&skipped);
    REQUIRE(c);
    CHECK(c->info.name == "epoch-2");
    REQUIRE(skipped.size() == 1);
    CHECK(skipped[0].check() == "latest");
    CHECK(skipped[0].path() == (dir / "latest").string());
    CHECK(std::string(skipped[0].what()).find("latest names epoch-7") != std::string::npos);
  }
  SUBCASE("latest holds garbage") {
    write_text(dir / "latest", "../etc");
    const auto c = store.load_latest(&skipped);
    REQUIRE(c);
    CHECK(c->info.name == "epoch-2");
    REQUIRE(skipped.size() == 1);
    CHECK(skipped[0].check() == "latest");
    CHECK(std::string(skipped[0].what()).find("'../etc'") != std::string::npos);
  }
  SUBCASE("the next save cleans the leftovers") {
    save_sample(store, {.epoch = 3, .step = 0});
    CHECK(hidden_entries(dir).empty());
    CHECK(fs::exists(dir / "epoch-03"));
    CHECK(names(store) == std::vector<std::string>{"epoch-1", "epoch-2", "epoch-3"});
    check_sample(*store.load_latest(), {.epoch = 3, .step = 0});
  }
}

TEST_CASE("load_latest returns nullopt when no checkpoint is intact") {
  const fs::path dir = fresh_dir("none");
  checkpoint_store store({.dir = dir, .keep = 3});
  std::vector<checkpoint_error> skipped;
  CHECK(store.list().empty());
  CHECK_FALSE(store.load_latest(&skipped).has_value());
  CHECK(skipped.empty());

  save_sample(store, {.epoch = 1, .step = 0});
  save_sample(store, {.epoch = 1, .step = 5});
  fs::remove(dir / "epoch-1" / "rank-0.optimizer.bin");
  write_text(dir / "epoch-1-step-5" / "manifest.json", "{");
  CHECK_FALSE(store.load_latest(&skipped).has_value());
  // Each broken checkpoint once, though `latest` names one of them.
  REQUIRE(skipped.size() == 2);
  CHECK(skipped[0].path() == (dir / "epoch-1-step-5" / "manifest.json").string());
  CHECK(skipped[0].check() == "manifest parse");
  CHECK(skipped[1].path() == (dir / "epoch-1" / "rank-0.optimizer.bin").string());
  CHECK(skipped[1].check() == "missing file");
  CHECK_FALSE(store.load_latest().has_value());
  const auto absent = error_of([&] { (void)store.load(dir / "epoch-9"); });
  REQUIRE(absent);
  CHECK(absent->check() == "directory");
  CHECK(absent->path() == (dir / "epoch-9").string());
}

TEST_CASE("saving over an existing name replaces the checkpoint whole") {
  const fs::path dir = fresh_dir("overwrite");
  checkpoint_store store({.dir = dir, .keep = 3});
  save_sample(store, {.epoch = 1, .step = 0});
  const std::vector<std::byte> params = payload(80, 9);
  const json state = {{"v", 2}};
  const std::vector<checkpoint_blob> blobs = {{.name = "rank-0.params.bin", .bytes = params}};
  store.save({.epoch = 1, .step = 0}, state, blobs);

  CHECK(names(store) == std::vector<std::string>{"epoch-1"});
  CHECK(hidden_entries(dir).empty());
  CHECK_FALSE(fs::exists(dir / "epoch-1" / "rank-0.optimizer.bin"));
  const auto c = store.load_latest();
  REQUIRE(c);
  CHECK(c->state == state);
  CHECK(c->files.size() == 1);
  CHECK(c->blob("rank-0.params.bin") == params);
}

TEST_CASE("a failed save throws checkpoint_error and leaves the earlier checkpoints as they were") {
  const fs::path dir = two_checkpoints("failed_save");
  checkpoint_store store({.dir = dir, .keep = 3});
  const sample three({.epoch = 3, .step = 0});

  std::optional<checkpoint_error> e;
  std::string check;
  fs::path path;
  SUBCASE("a file name with a slash") {
    std::vector<checkpoint_blob> blobs = three.blobs();
    blobs[1].name = "rank-0/optimizer.bin";
    e = error_of([&] { store.save({.epoch = 3, .step = 0}, three.state, blobs); });
    check = "file name";
    path = dir / (".tmp-epoch-3-" + std::to_string(::getpid()));
  }
  SUBCASE("two files of one name") {
    std::vector<checkpoint_blob> blobs = three.blobs();
    blobs[1].name = blobs[0].name;
    e = error_of([&] { store.save({.epoch = 3, .step = 0}, three.state, blobs); });
    check = "file name";
    path = dir / (".tmp-epoch-3-" + std::to_string(::getpid()));
  }
  SUBCASE("the staging path is a file") {
    path = dir / (".tmp-epoch-3-" + std::to_string(::getpid()));
    write_text(path, "in the way");
    e = error_of([&] { store.save({.epoch = 3, .step = 0}, three.state, three.blobs()); });
    check = "create directory";
    fs::remove(path);
  }
  SUBCASE("latest.tmp cannot be written") {
    path = dir / "latest.tmp";
    fs::create_directories(path / "in-the-way");
    e = error_of([&] { store.save({.epoch = 3, .step = 0}, three.state, three.blobs()); });
    check = "write";
    fs::remove_all(path);
  }
  SUBCASE("latest.tmp cannot be written while replacing a checkpoint") {
    path = dir / "latest.tmp";
    fs::create_directories(path / "in-the-way");
    e = error_of([&] { store.save({.epoch = 2, .step = 0}, three.state, three.blobs()); });
    check = "write";
    fs::remove_all(path);
  }

  REQUIRE(e);
  CHECK(e->check() == check);
  CHECK(e->path() == path.string());
  CHECK(names(store) == std::vector<std::string>{"epoch-1", "epoch-2"});
  CHECK(hidden_entries(dir).empty());
  CHECK(read_text(dir / "latest") == "epoch-2\n");
  std::vector<checkpoint_error> skipped;
  const auto c = store.load_latest(&skipped);
  REQUIRE(c);
  check_sample(*c, {.epoch = 2, .step = 0});
  CHECK(skipped.empty());
  check_sample(store.load(dir / "epoch-1"), {.epoch = 1, .step = 0});
}

TEST_CASE("a checkpoint directory that is a regular file is an error") {
  const fs::path file = fresh_dir("not_a_dir");
  write_text(file, "a file");
  checkpoint_store store({.dir = file, .keep = 3});
  const auto saving = error_of([&] { save_sample(store, {.epoch = 1, .step = 0}); });
  REQUIRE(saving);
  CHECK(saving->check() == "create directory");
  CHECK(saving->path() == file.string());
  const auto listing = error_of([&] { (void)store.list(); });
  REQUIRE(listing);
  CHECK(listing->check() == "directory");
  CHECK_THROWS_AS((void)store.load_latest(), checkpoint_error);
  CHECK(read_text(file) == "a file");
  fs::remove(file);
}

TEST_CASE("ranks write their own files into one stage and rank 0 commits") {
  const fs::path dir = fresh_dir("ranks");
  checkpoint_store store({.dir = dir, .keep = 3, .config_hash = "h"});
  const checkpoint_position p{.epoch = 0, .step = 20};
  const std::vector<std::byte> r0p = payload(32, 1);
  const std::vector<std::byte> r0o = payload(16, 2);
  const std::vector<std::byte> r1p = payload(32, 3);
  const std::vector<std::byte> r1o = payload(16, 4);
  const std::vector<checkpoint_blob> rank0 = {{.name = "rank-0.params.bin", .bytes = r0p},
                                              {.name = "rank-0.optimizer.bin", .bytes = r0o}};
  const std::vector<checkpoint_blob> rank1 = {{.name = "rank-1.params.bin", .bytes = r1p},
                                              {.name = "rank-1.optimizer.bin", .bytes = r1o}};

  SUBCASE("commit of every rank's records") {
    const auto stage0 = store.begin(p, 4242);
    const auto stage1 = store.begin(p, 4242);
    CHECK(stage0 == stage1);
    CHECK(stage0.path == dir / ".tmp-epoch-0-step-20-4242");
    std::vector<checkpoint_file_record> records = store.write(stage0, rank0);
    const std::vector<checkpoint_file_record> records1 = store.write(stage1, rank1);
    records.insert(records.end(), records1.begin(), records1.end());
    write_text(stage0.path / "stray.bin", "not listed");
    const checkpoint_info info = store.commit(stage0, json{{"world_size", 2}}, records);
    CHECK(info.name == "epoch-0-step-20");
    CHECK_FALSE(fs::exists(info.path / "stray.bin"));
    CHECK_FALSE(fs::exists(stage0.path));
    const auto c = store.load_latest();
    REQUIRE(c);
    CHECK(c->files == records);
    CHECK(c->blobs.size() == 4);
    CHECK(c->blob("rank-1.params.bin") == r1p);
    CHECK(c->blob("rank-0.optimizer.bin") == r0o);
    CHECK(c->state == json{{"world_size", 2}});
  }
  SUBCASE("records that do not match the staged files") {
    const auto stage = store.begin(p, 7);
    std::vector<checkpoint_file_record> records = store.write(stage, rank0);
    std::string check;
    SUBCASE("a rank's file is missing") {
      records.push_back({.name = "rank-1.params.bin", .size = 32, .xxh3 = 1});
      check = "missing file";
    }
    SUBCASE("a size differs") {
      records[0].size += 1;
      check = "size";
    }
    SUBCASE("two ranks wrote one name") {
      records.push_back(records[0]);
      check = "file name";
    }
    const auto e = error_of([&] { store.commit(stage, json::object(), records); });
    REQUIRE(e);
    CHECK(e->check() == check);
    CHECK(store.list().empty());
    CHECK_FALSE(fs::exists(dir / "latest"));
    store.abandon(stage);
    CHECK(hidden_entries(dir).empty());
  }
}

TEST_CASE("check_config_hash refuses a checkpoint saved under another configuration") {
  const fs::path dir = fresh_dir("config_hash");
  checkpoint_store old_run({.dir = dir, .keep = 3, .config_hash = "aaa111"});
  save_sample(old_run, {.epoch = 1, .step = 0});

  checkpoint_store new_run({.dir = dir, .keep = 3, .config_hash = "bbb222"});
  const auto c = new_run.load_latest();
  REQUIRE(c);
  CHECK(c->config_hash == "aaa111");
  CHECK_NOTHROW(strata::train::check_config_hash(*c, "aaa111"));
  const auto e = error_of([&] { strata::train::check_config_hash(*c, "bbb222"); });
  REQUIRE(e);
  CHECK(e->check() == "config hash");
  CHECK(e->path() == (dir / "epoch-1").string());
  const std::string what = e->what();
  CHECK(what.find("'aaa111'") != std::string::npos);
  CHECK(what.find("'bbb222'") != std::string::npos);
}

TEST_CASE("the fault suite's checkpoint, gradient and loader faults parse; bad ones are named") {
  using strata::train::checkpoint_phase;
  const auto c = strata::train::parse_checkpoint_fault("phase=latest,save=3");
  CHECK(c.phase == checkpoint_phase::latest);
  CHECK(c.save == 3);
  CHECK(strata::train::parse_checkpoint_fault("save=2,phase=cleanup").phase ==
        checkpoint_phase::cleanup);
  const auto g = strata::train::parse_gradient_fault("rank=1,step=40,every");
  CHECK(g.hits(1, 40));
  CHECK(g.hits(1, 41));
  CHECK_FALSE(g.hits(1, 39));
  CHECK_FALSE(g.hits(0, 40));
  const auto once = strata::train::parse_gradient_fault("step=7,rank=0");
  CHECK(once.hits(0, 7));
  CHECK_FALSE(once.hits(0, 8));

  const auto message = [](auto&& parse, std::string_view text) {
    try {
      (void)parse(text);
    } catch (const strata::error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto checkpoint = [](std::string_view t) {
    return strata::train::parse_checkpoint_fault(t);
  };
  const auto gradient = [](std::string_view t) { return strata::train::parse_gradient_fault(t); };
  CHECK(message(checkpoint, "phase=rename,save=0") ==
        "STRATA_CHECKPOINT_FAULT='phase=rename,save=0': save must be a positive integer, not '0'");
  CHECK(message(checkpoint, "phase=commit") ==
        "STRATA_CHECKPOINT_FAULT='phase=commit': unknown phase 'commit' (shards, manifest, "
        "rename, latest or cleanup)");
  CHECK(message(checkpoint, "save=1") == "STRATA_CHECKPOINT_FAULT='save=1': phase=... is required");
  CHECK(message(gradient, "rank=1") ==
        "STRATA_GRADIENT_FAULT='rank=1': rank=... and step=... are required");
  CHECK(message(gradient, "rank=1,step=x") ==
        "STRATA_GRADIENT_FAULT='rank=1,step=x': step must be a non-negative integer, not 'x'");
  const auto l = strata::data::parse_loader_fault("sample=12,action=stall,epoch=1");
  CHECK(l.action == strata::data::loader_fault::kind::stall);
  CHECK(l.hits(1, 12));
  CHECK_FALSE(l.hits(0, 12));
  CHECK(strata::data::parse_loader_fault("action=throw,sample=3").hits(7, 3));
  const auto loader = [](std::string_view t) { return strata::data::parse_loader_fault(t); };
  CHECK(message(loader, "sample=3,action=crash") ==
        "STRATA_LOADER_FAULT='sample=3,action=crash': unknown action 'crash' (throw or stall)");
  CHECK(message(loader, "sample=3") ==
        "STRATA_LOADER_FAULT='sample=3': sample=... and action=... are required");
  CHECK(message(gradient, "rank=1,step=2,often") ==
        "STRATA_GRADIENT_FAULT='rank=1,step=2,often': unknown field 'often' (rank=R, step=S, "
        "every)");
}
