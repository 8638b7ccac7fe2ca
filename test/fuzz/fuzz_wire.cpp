// libFuzzer: what a duckd peer decodes from the network: a frame header, an
// error payload, and the host's check of duckd's answer to hello (reply
// layout, auth, nonce, tag), and a payload checked against a connection's
// keys; the whole-frame decoder over the same bytes.
#include "duck_rt/wire_codec.h"

#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (auto v = duck::duckd::DecodeFrame({data, size}, 1u << 20); v.ok())
    if (v->frame_bytes > size || v->payload.size() != v->header.payload_bytes)
      __builtin_trap();
  duckd_frame_header h;
  if (size < sizeof h)
    return 0;
  std::memcpy(&h, data, sizeof h);
  (void)duck::duckd::ValidateHeader(h, 1u << 20);
  (void)duck::duckd::MessageTypeName(h.type);
  const auto payload = absl::MakeConstSpan(data + sizeof h, size - sizeof h);
  auto e = duck::duckd::DecodeError(payload);
  (void)e;
  // As the answer to a hello, with a token and without one.
  for (const char *token : {"fuzz-token", ""}) {
    auto hello = duck::duckd::BeginHello(token);
    if (!hello.ok())
      __builtin_trap();
    duck::duckd::FrameKeys keys = hello->keys;
    (void)duck::duckd::FinishHello(*hello, h, payload, &keys);
    // A frame that verifies here would be a forged tag (or a checksum the
    // input carried): both are fine; what matters is no crash.
    (void)duck::duckd::CheckPayload(h, payload, &keys);
  }
  return 0;
}
