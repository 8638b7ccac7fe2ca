//===- ClusterFile.cpp - a cluster of ducks, as a JSON file ---------------===//
#include "duck/runtime/cluster/ClusterFile.h"

#include "absl/strings/str_cat.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <iterator>

namespace duck::runtime {

namespace {

/// The links, with duckc's rules: a number, not negative.
absl::Status ReadLinks(const nlohmann::json &j, const std::string &path,
                       ClusterFile *c) {
  for (auto [key, out] : {std::pair<const char *, double *>{
                              "host_link_gbps", &c->host_link_gbps},
                          {"duck_link_gbps", &c->duck_link_gbps},
                          {"latency_us", &c->latency_us}}) {
    if (!j.contains(key))
      continue;
    if (!j[key].is_number())
      return absl::InvalidArgumentError(absl::StrCat(
          "cluster file '", path, "': '", key, "' must be a number"));
    *out = j[key].get<double>();
    if (*out < 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "cluster file '", path, "': ", key, " must not be negative (got ",
          *out, ")"));
  }
  return absl::OkStatus();
}

} // namespace

absl::StatusOr<ClusterFile> ParseClusterFile(absl::string_view text,
                                             const std::string &path) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr,
                                           /*allow_exceptions=*/false);
  if (j.is_discarded())
    return absl::InvalidArgumentError(
        absl::StrCat("cluster file '", path, "' is not valid JSON"));
  if (!j.is_object())
    return absl::InvalidArgumentError(
        absl::StrCat("cluster file '", path, "' is not a JSON object"));
  ClusterFile c;
  if (j.contains("token") && j["token"].is_string())
    c.token = j["token"].get<std::string>();
  if (j.contains("bandwidth_gbs") && j["bandwidth_gbs"].is_number())
    c.bandwidth_gbs = j["bandwidth_gbs"].get<double>();
  if (absl::Status st = ReadLinks(j, path, &c); !st.ok())
    return st;
  if (j.contains("cast")) {
    auto ep = j["cast"].is_string()
                  ? ParseDuckEndpoint(j["cast"].get<std::string>())
                  : absl::InvalidArgumentError("not a string");
    if (!ep.ok() || ep->port == 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "cluster file '", path,
          "': \"cast\" must be \"ADDR:PORT\" (the ducks' multicast group "
          "and port, e.g. \"239.77.0.1:7420\")",
          ep.ok() ? ": port 0" : absl::StrCat(": ", ep.status().message())));
    c.cast_address = ep->host;
    c.cast_port = ep->port;
  }
  if (j.contains("cast_interface")) {
    if (!j["cast_interface"].is_string())
      return absl::InvalidArgumentError(
          absl::StrCat("cluster file '", path,
                       "': \"cast_interface\" must be a string (an IPv4 "
                       "address of the host)"));
    c.cast_interface = j["cast_interface"].get<std::string>();
  }
  if (!j.contains("ducks") || !j["ducks"].is_array() || j["ducks"].empty())
    return absl::InvalidArgumentError(
        absl::StrCat("cluster file '", path,
                     "' needs a non-empty \"ducks\" array of "
                     "{\"host\": ..., \"port\": ...}"));
  auto endpoints = [&](const char *key,
                       std::vector<DuckEndpoint> *out) -> absl::Status {
    for (size_t i = 0; i < j[key].size(); ++i) {
      const nlohmann::json &d = j[key][i];
      if (!d.is_object() || !d.contains("host") || !d["host"].is_string() ||
          !d.contains("port") || !d["port"].is_number_integer())
        return absl::InvalidArgumentError(
            absl::StrCat("cluster file '", path, "': ", key, "[", i,
                         "] needs \"host\" (string) and \"port\" (integer)"));
      auto ep = ParseDuckEndpoint(absl::StrCat(d["host"].get<std::string>(),
                                               ":", d["port"].get<int>()));
      if (!ep.ok())
        return absl::InvalidArgumentError(
            absl::StrCat("cluster file '", path, "': ", key, "[", i,
                         "]: ", ep.status().message()));
      out->push_back(*ep);
    }
    return absl::OkStatus();
  };
  if (absl::Status st = endpoints("ducks", &c.ducks); !st.ok())
    return st;
  if (j.contains("spares")) {
    if (!j["spares"].is_array())
      return absl::InvalidArgumentError(
          absl::StrCat("cluster file '", path,
                       "': \"spares\" must be an array of "
                       "{\"host\": ..., \"port\": ...}"));
    if (absl::Status st = endpoints("spares", &c.spares); !st.ok())
      return st;
  }
  return c;
}

absl::StatusOr<ClusterFile> LoadClusterFile(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  const std::string text((std::istreambuf_iterator<char>(f)),
                         std::istreambuf_iterator<char>());
  return ParseClusterFile(text, path);
}

} // namespace duck::runtime
