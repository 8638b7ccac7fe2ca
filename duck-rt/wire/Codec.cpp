// The duckd protocol's frame codec: checksums, frame authentication,
// headers, whole frames to and from byte buffers, error payloads. No
// socket I/O (SocketIo.cpp holds that, over file descriptors).
#include "duck_rt/wire_codec.h"

#include "absl/strings/str_cat.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <sys/random.h>
#include <xxhash.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>

namespace duck::duckd {

namespace avx2 { // ChecksumAvx2.cpp
uint64_t Hash(const void *data, size_t bytes);
void *NewState();
void FreeState(void *s);
void Reset(void *s);
void Update(void *s, const void *data, size_t bytes);
uint64_t Digest(const void *s);
} // namespace avx2

namespace {
bool HasAvx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
}
} // namespace

uint64_t Checksum(const void *data, size_t bytes) {
  return HasAvx2() ? avx2::Hash(data, bytes) : XXH3_64bits(data, bytes);
}

StreamingChecksum::StreamingChecksum()
    : state_(HasAvx2() ? avx2::NewState() : XXH3_createState()) {
  Reset();
}
StreamingChecksum::~StreamingChecksum() {
  if (HasAvx2())
    avx2::FreeState(state_);
  else
    XXH3_freeState(static_cast<XXH3_state_t *>(state_));
}
void StreamingChecksum::Reset() {
  if (HasAvx2())
    avx2::Reset(state_);
  else
    XXH3_64bits_reset(static_cast<XXH3_state_t *>(state_));
}
void StreamingChecksum::Update(const void *data, size_t bytes) {
  if (HasAvx2())
    avx2::Update(state_, data, bytes);
  else
    XXH3_64bits_update(static_cast<XXH3_state_t *>(state_), data, bytes);
}
uint64_t StreamingChecksum::Digest() const {
  return HasAvx2() ? avx2::Digest(state_)
                   : XXH3_64bits_digest(static_cast<XXH3_state_t *>(state_));
}

namespace {

// The header bytes a tag covers: everything before the check field.
constexpr size_t kSealedHeaderBytes = offsetof(duckd_frame_header,
                                               payload_checksum);

/// OpenSSL's HMAC, fetched once per process.
EVP_MAC *HmacMethod() {
  static EVP_MAC *mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  return mac;
}

/// An HMAC-SHA256 context (EVP_MAC_CTX) with the digest chosen.
EVP_MAC_CTX *NewHmac() {
  EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(HmacMethod());
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_end()};
  if (!ctx || !EVP_MAC_CTX_set_params(ctx, params)) {
    std::fprintf(stderr, "duck wire: OpenSSL has no HMAC-SHA256\n");
    std::abort();
  }
  return ctx;
}

/// Starts a tag: key, then role || seq || the sealed header bytes.
void BeginTag(EVP_MAC_CTX *ctx, const uint8_t *key, uint8_t role,
              uint64_t seq, const duckd_frame_header &h) {
  EVP_MAC_init(ctx, key, kKeyBytes, nullptr);
  uint8_t prefix[1 + 8 + kSealedHeaderBytes];
  prefix[0] = role;
  for (int i = 0; i < 8; ++i)
    prefix[1 + i] = uint8_t(seq >> (8 * i));
  std::memcpy(prefix + 9, &h, kSealedHeaderBytes);
  EVP_MAC_update(ctx, prefix, sizeof prefix);
}

uint64_t FinishTag(EVP_MAC_CTX *ctx) {
  uint8_t out[32];
  size_t len = 0;
  EVP_MAC_final(ctx, out, &len, sizeof out);
  uint64_t tag = 0;
  for (int i = 7; i >= 0; --i)
    tag = (tag << 8) | out[i];
  return tag;
}

/// HMAC-SHA256(key, label || nonces...) as a frame key.
void DeriveKey(absl::string_view token, absl::string_view label,
               const uint8_t *a, const uint8_t *b, uint8_t *out) {
  EVP_MAC_CTX *ctx = NewHmac();
  EVP_MAC_init(ctx, reinterpret_cast<const uint8_t *>(token.data()),
               token.size(), nullptr);
  EVP_MAC_update(ctx, reinterpret_cast<const uint8_t *>(label.data()),
                 label.size());
  EVP_MAC_update(ctx, a, kNonceBytes);
  if (b)
    EVP_MAC_update(ctx, b, kNonceBytes);
  size_t len = 0;
  EVP_MAC_final(ctx, out, &len, kKeyBytes);
  EVP_MAC_CTX_free(ctx);
}

uint8_t Peer(uint8_t role) {
  return role == kRoleHost ? kRoleDuck : kRoleHost;
}

} // namespace

FrameKeys HelloKeys(absl::string_view token, const uint8_t *host_nonce,
                    uint8_t role) {
  FrameKeys k;
  DeriveKey(token, "duckd hello", host_nonce, nullptr, k.key);
  k.keyed = 1;
  k.role = role;
  return k;
}

FrameKeys ConnectionKeys(absl::string_view token, const uint8_t *host_nonce,
                         const uint8_t *duck_nonce, uint8_t role) {
  FrameKeys k;
  DeriveKey(token, "duckd frames", host_nonce, duck_nonce, k.key);
  k.keyed = 1;
  k.role = role;
  k.send_seq = k.recv_seq = 1;
  return k;
}

void MeshKey(absl::string_view token, const uint8_t *connector_nonce,
             const uint8_t *acceptor_nonce, uint8_t *key) {
  DeriveKey(token, "duck mesh", connector_nonce, acceptor_nonce, key);
}

void MeshProof(const uint8_t *key, uint8_t role, uint8_t *proof) {
  uint8_t label[kNonceBytes] = {'d', 'u', 'c', 'k', ' ', 'm', 'e', 's',
                                'h', ' ', 'p', 'r', 'o', 'o', 'f', role};
  DeriveKey(absl::string_view(reinterpret_cast<const char *>(key), kKeyBytes),
            "", label, nullptr, proof);
}

absl::Status RandomNonce(uint8_t *out) {
  size_t got = 0;
  while (got < kNonceBytes) {
    ssize_t n = ::getrandom(out + got, kNonceBytes - got, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return absl::InternalError(
          absl::StrCat("getrandom: ", std::strerror(errno)));
    got += size_t(n);
  }
  return absl::OkStatus();
}

void WarmUpFrameAuth(FrameCheck *given) {
  uint8_t nonce[kNonceBytes] = {};
  FrameKeys k = ConnectionKeys("warm-up", nonce, nonce, kRoleDuck);
  const uint8_t byte = 0;
  Part p{&byte, 1};
  duckd_frame_header h = MakeHeader(DUCKD_MSG_NOTICE, 0, 0, {&p, 1}, &k);
  FrameCheck own;
  FrameCheck &check = given ? *given : own;
  k.role = kRoleHost; // check the frame as its receiver
  k.recv_seq = k.send_seq - 1;
  check.Begin(h, &k);
  check.Update(&byte, 1);
  if (!check.Finish().ok()) {
    std::fprintf(stderr, "duck wire: HMAC-SHA256 self-check failed\n");
    std::abort();
  }
}

absl::StatusOr<HostHello> BeginHello(absl::string_view token) {
  if (token.size() > DUCKD_MAX_TOKEN_BYTES)
    return absl::InvalidArgumentError(absl::StrCat(
        "token of ", token.size(), " bytes; at most ", DUCKD_MAX_TOKEN_BYTES));
  HostHello hello;
  hello.request.abi_version = DUCK_ABI_VERSION;
  hello.request.protocol_version = DUCKD_PROTOCOL_VERSION;
  hello.token = std::string(token);
  if (!token.empty()) {
    if (absl::Status s = RandomNonce(hello.request.nonce); !s.ok())
      return s;
    hello.request.auth = DUCKD_AUTH_HMAC_SHA256;
    hello.keys = HelloKeys(token, hello.request.nonce, kRoleHost);
  }
  return hello;
}

absl::Status FinishHello(const HostHello &hello, const duckd_frame_header &h,
                         absl::Span<const uint8_t> payload, FrameKeys *keys) {
  if ((h.flags & DUCKD_FLAG_ERROR) || h.type != DUCKD_MSG_HELLO)
    return CheckPayload(h, payload, nullptr);
  duckd_hello_reply rep;
  if (payload.size() < sizeof rep)
    return absl::InvalidArgumentError("hello reply shorter than its header");
  std::memcpy(&rep, payload.data(), sizeof rep);
  if (hello.token.empty()) {
    if (rep.auth != DUCKD_AUTH_NONE)
      return absl::PermissionDeniedError(
          "duckd authenticates its frames but the host has no token");
    *keys = FrameKeys{};
    return CheckPayload(h, payload, nullptr);
  }
  if (rep.auth != DUCKD_AUTH_HMAC_SHA256)
    return absl::PermissionDeniedError(
        "duckd answered without authentication, but the host has a token: "
        "start duckd with the same --token");
  FrameKeys k = ConnectionKeys(hello.token, hello.request.nonce, rep.nonce,
                               kRoleHost);
  k.recv_seq = 0; // the reply is the duck's first frame
  if (absl::Status s = CheckPayload(h, payload, &k); !s.ok())
    return s;
  *keys = k;
  return absl::OkStatus();
}

FrameCheck::FrameCheck() : mac_(nullptr) {}
FrameCheck::~FrameCheck() {
  if (mac_)
    EVP_MAC_CTX_free(static_cast<EVP_MAC_CTX *>(mac_));
}

void FrameCheck::Begin(const duckd_frame_header &h, FrameKeys *keys) {
  expect_ = h.payload_checksum;
  keys_ = keys && keys->keyed ? keys : nullptr;
  if (!keys_) {
    sum_.Reset();
    return;
  }
  if (!mac_)
    mac_ = NewHmac();
  BeginTag(static_cast<EVP_MAC_CTX *>(mac_), keys_->key, Peer(keys_->role),
           keys_->recv_seq, h);
}

void FrameCheck::Update(const void *data, size_t bytes) {
  if (!keys_)
    sum_.Update(data, bytes);
  else if (bytes)
    EVP_MAC_update(static_cast<EVP_MAC_CTX *>(mac_),
                   static_cast<const uint8_t *>(data), bytes);
}

absl::Status FrameCheck::Finish() {
  if (!keys_)
    return sum_.Digest() == expect_
               ? absl::OkStatus()
               : absl::DataLossError("payload checksum mismatch");
  const uint64_t seq = keys_->recv_seq++;
  if (FinishTag(static_cast<EVP_MAC_CTX *>(mac_)) == expect_)
    return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "frame authentication failed (frame ", seq,
      " of the connection: altered, replayed, out of order, or sealed with "
      "another token)"));
}

absl::Status CheckPayload(const duckd_frame_header &h,
                          absl::Span<const uint8_t> payload, FrameKeys *keys) {
  if (!keys || !keys->keyed)
    return Checksum(payload.data(), payload.size()) == h.payload_checksum
               ? absl::OkStatus()
               : absl::DataLossError("payload checksum mismatch");
  thread_local FrameCheck check;
  check.Begin(h, keys);
  check.Update(payload.data(), payload.size());
  return check.Finish();
}

duckd_frame_header MakeHeader(uint16_t type, uint32_t flags,
                              uint32_t request_id,
                              absl::Span<const Part> payload,
                              FrameKeys *keys) {
  duckd_frame_header h{};
  h.magic = DUCKD_FRAME_MAGIC;
  h.version = DUCKD_PROTOCOL_VERSION;
  h.type = type;
  h.flags = flags;
  h.request_id = request_id;
  uint64_t total = 0;
  for (const Part &p : payload)
    total += p.bytes;
  h.payload_bytes = total;
  if (keys && keys->keyed) {
    struct Hmac {
      EVP_MAC_CTX *ctx = NewHmac();
      ~Hmac() { EVP_MAC_CTX_free(ctx); }
    };
    thread_local Hmac hmac; // no allocation per frame
    EVP_MAC_CTX *ctx = hmac.ctx;
    BeginTag(ctx, keys->key, keys->role, keys->send_seq++, h);
    for (const Part &p : payload)
      if (p.bytes)
        EVP_MAC_update(ctx, static_cast<const uint8_t *>(p.data), p.bytes);
    h.payload_checksum = FinishTag(ctx);
  } else if (payload.size() == 1) {
    h.payload_checksum = Checksum(payload[0].data, payload[0].bytes);
  } else {
    thread_local StreamingChecksum sum; // no allocation per frame
    sum.Reset();
    for (const Part &p : payload)
      sum.Update(p.data, p.bytes);
    h.payload_checksum = sum.Digest();
  }
  return h;
}

absl::Status ValidateHeader(const duckd_frame_header &h, uint64_t max_payload) {
  if (h.magic != DUCKD_FRAME_MAGIC)
    return absl::InvalidArgumentError(
        absl::StrCat("bad frame magic 0x", absl::Hex(h.magic),
                     " (not a duckd protocol peer)"));
  if (h.version != DUCKD_PROTOCOL_VERSION)
    return absl::FailedPreconditionError(
        absl::StrCat("protocol version ", h.version, ", this side speaks ",
                     DUCKD_PROTOCOL_VERSION));
  if (h.type == 0 || h.type >= DUCKD_MSG_COUNT)
    return absl::InvalidArgumentError(
        absl::StrCat("unknown message type ", h.type));
  if (h.flags &
      ~uint32_t(DUCKD_FLAG_REPLY | DUCKD_FLAG_ERROR | DUCKD_FLAG_QUIET))
    return absl::InvalidArgumentError(
        absl::StrCat("unknown frame flags 0x", absl::Hex(h.flags)));
  if (h.payload_bytes > max_payload)
    return absl::ResourceExhaustedError(
        absl::StrCat("payload of ", h.payload_bytes, " bytes exceeds the ",
                     max_payload, "-byte limit"));
  return absl::OkStatus();
}

void AppendFrame(std::vector<uint8_t> *out, uint16_t type, uint32_t flags,
                 uint32_t request_id, absl::Span<const Part> payload,
                 FrameKeys *keys) {
  const duckd_frame_header h =
      MakeHeader(type, flags, request_id, payload, keys);
  const size_t at = out->size();
  out->resize(at + sizeof h + h.payload_bytes);
  uint8_t *p = out->data() + at;
  std::memcpy(p, &h, sizeof h);
  p += sizeof h;
  for (const Part &part : payload)
    if (part.bytes) {
      std::memcpy(p, part.data, part.bytes);
      p += part.bytes;
    }
}

std::vector<uint8_t> EncodeFrame(uint16_t type, uint32_t flags,
                                 uint32_t request_id,
                                 absl::Span<const Part> payload,
                                 FrameKeys *keys) {
  std::vector<uint8_t> out;
  AppendFrame(&out, type, flags, request_id, payload, keys);
  return out;
}

absl::StatusOr<duckd_frame_header> DecodeHeader(absl::Span<const uint8_t> bytes,
                                                uint64_t max_payload) {
  duckd_frame_header h;
  if (bytes.size() < sizeof h)
    return absl::OutOfRangeError(
        absl::StrCat("truncated frame: ", bytes.size(), " of the header's ",
                     sizeof h, " bytes"));
  std::memcpy(&h, bytes.data(), sizeof h);
  if (absl::Status s = ValidateHeader(h, max_payload); !s.ok())
    return s;
  return h;
}

absl::StatusOr<FrameView> DecodeFrame(absl::Span<const uint8_t> bytes,
                                      uint64_t max_payload, FrameKeys *keys) {
  absl::StatusOr<duckd_frame_header> h = DecodeHeader(bytes, max_payload);
  if (!h.ok())
    return h.status();
  const uint64_t have = bytes.size() - sizeof *h;
  if (have < h->payload_bytes)
    return absl::OutOfRangeError(absl::StrCat(
        "truncated frame: ", have, " of its ", h->payload_bytes,
        "-byte payload (", MessageTypeName(h->type), ")"));
  FrameView v;
  v.header = *h;
  v.payload = bytes.subspan(sizeof *h, h->payload_bytes);
  v.frame_bytes = sizeof *h + h->payload_bytes;
  if (absl::Status s = CheckPayload(v.header, v.payload, keys); !s.ok())
    return s;
  return v;
}

std::string EncodeError(duckd_error_code code, absl::string_view message) {
  duckd_error e{};
  e.code = code;
  e.message_bytes = static_cast<uint32_t>(message.size());
  std::string out(sizeof e, '\0');
  std::memcpy(out.data(), &e, sizeof e);
  out.append(message.data(), message.size());
  return out;
}

absl::StatusOr<WireError> DecodeError(absl::Span<const uint8_t> payload) {
  duckd_error e;
  if (payload.size() < sizeof e)
    return absl::InvalidArgumentError("error reply shorter than its header");
  std::memcpy(&e, payload.data(), sizeof e);
  if (e.message_bytes != payload.size() - sizeof e)
    return absl::InvalidArgumentError("error reply length mismatch");
  return WireError{static_cast<duckd_error_code>(e.code),
                   std::string(reinterpret_cast<const char *>(payload.data()) +
                                   sizeof e,
                               e.message_bytes)};
}

const char *MessageTypeName(uint16_t type) {
  switch (type) {
  case DUCKD_MSG_HELLO: return "hello";
  case DUCKD_MSG_OPEN: return "open";
  case DUCKD_MSG_STEP: return "step";
  case DUCKD_MSG_RUN: return "run";
  case DUCKD_MSG_PREPARE_BEGIN: return "prepare_begin";
  case DUCKD_MSG_PREPARE_WRITE: return "prepare_write";
  case DUCKD_MSG_PREPARE_FINISH: return "prepare_finish";
  case DUCKD_MSG_CLOSE: return "close";
  case DUCKD_MSG_NOTICE: return "notice";
  case DUCKD_MSG_MEASURE: return "measure";
  case DUCKD_MSG_STATS: return "stats";
  case DUCKD_MSG_MESH:
    return "mesh";
  case DUCKD_MSG_MESH_PROBE: return "mesh_probe";
  case DUCKD_MSG_STEP_CAST: return "step_cast";
  case DUCKD_MSG_STEP_STAGED:
    return "step_staged";
  default: return "unknown";
  }
}

const char *ErrorCodeName(uint32_t code) {
  switch (code) {
  case DUCKD_ERR_BAD_FRAME: return "bad_frame";
  case DUCKD_ERR_BAD_REQUEST: return "bad_request";
  case DUCKD_ERR_BAD_ABI: return "bad_abi";
  case DUCKD_ERR_UNAUTHORIZED: return "unauthorized";
  case DUCKD_ERR_BUSY: return "busy";
  case DUCKD_ERR_NO_SESSION: return "no_session";
  case DUCKD_ERR_BAD_ELF: return "bad_elf";
  case DUCKD_ERR_STEP_CRASHED: return "step_crashed";
  case DUCKD_ERR_STEP_TIMEOUT: return "step_timeout";
  case DUCKD_ERR_CACHE: return "cache";
  case DUCKD_ERR_TOO_LARGE: return "too_large";
  case DUCKD_ERR_INTERNAL: return "internal";
  case DUCKD_ERR_CAST_MISSED: return "cast_missed";
  case DUCKD_ERR_STAGE_MISSED:
    return "stage_missed";
  default: return "unknown";
  }
}

} // namespace duck::duckd
