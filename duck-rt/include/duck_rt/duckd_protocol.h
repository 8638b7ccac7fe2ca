// The duckd wire protocol: the frames a host and a duckd exchange over TCP
// (docs/protocol.md explains every call). C-compatible, little-endian,
// versioned as a schema: message types and fields are only appended; sizes
// are pinned with static asserts at the bottom.
//
// A frame is a fixed 32-byte header followed by `payload_bytes` bytes. The
// header carries a check of the payload: its XXH3-64, or on a connection
// whose hello authenticated, a 64-bit HMAC-SHA256 tag keyed from the token
// and both sides' nonces (duck_rt/wire.h). A receiver validates the header
// (magic, version, known type, length limit) before reading the payload and
// the check before using it.
#ifndef DUCK_RT_DUCKD_PROTOCOL_H
#define DUCK_RT_DUCKD_PROTOCOL_H

#include "duck_rt/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DUCKD_FRAME_MAGIC 0x50574B44u /* "DKWP" little-endian */
enum {
  DUCKD_PROTOCOL_VERSION = 5, // 2: authenticated frames, no token on the
                              // wire; 3: measure replies the GEMM rate;
                              // 4: quiet stages (DUCKD_FLAG_QUIET);
                              // 5: cast stages (DUCKD_MSG_STEP_STAGED)
  DUCKD_DEFAULT_MAX_PAYLOAD = 256 << 20,
  DUCKD_MAX_CORES = 64,
  DUCKD_NAME_BYTES = 64,
  DUCKD_MAX_TOKEN_BYTES = 256,
  DUCKD_NONCE_BYTES = 16,
};

/// How a connection's frames are checked (hello's `auth`).
typedef enum duckd_auth {
  DUCKD_AUTH_NONE = 0,        // XXH3-64 of the payload
  DUCKD_AUTH_HMAC_SHA256 = 1, // a tag keyed from the token (wire.h)
} duckd_auth;

/// Message types; a reply carries the request's type. Append only.
typedef enum duckd_msg_type {
  DUCKD_MSG_HELLO = 1,
  DUCKD_MSG_OPEN = 2,
  DUCKD_MSG_STEP = 3,
  DUCKD_MSG_RUN = 4,
  DUCKD_MSG_PREPARE_BEGIN = 5,
  DUCKD_MSG_PREPARE_WRITE = 6,
  DUCKD_MSG_PREPARE_FINISH = 7,
  DUCKD_MSG_CLOSE = 8,
  DUCKD_MSG_NOTICE = 9,   // unsolicited, from duckd (e.g. "busy"), then close
  DUCKD_MSG_MEASURE = 10, // the duck's own rates, for the cost model
  DUCKD_MSG_STATS = 11,   // the duck's counters (the weight scrub's)
  DUCKD_MSG_MESH = 12,    // join the ducks' mesh (duck_rt/peer_mesh.h)
  DUCKD_MSG_MESH_PROBE = 13,  // time collectives over the joined mesh
  DUCKD_MSG_STEP_CAST = 14,   // a step whose IB came as cast datagrams
  DUCKD_MSG_STEP_STAGED = 15, // a staged step whose stage came as a cast
  DUCKD_MSG_COUNT = 16,
} duckd_msg_type;

typedef enum duckd_frame_flags {
  DUCKD_FLAG_REPLY = 1u << 0,
  DUCKD_FLAG_ERROR = 1u << 1, // payload is a duckd_error
  /// On a step or step_cast request whose IB is a stage (abi.h,
  /// DUCK_IB_STAGE): duckd answers nothing, not even an error. A quiet
  /// frame that does not leave a stage (it failed, or carried no stage)
  /// leaves none, so the staged step after it is answered stage_missed.
  DUCKD_FLAG_QUIET = 1u << 2,
} duckd_frame_flags;

typedef struct duckd_frame_header {
  uint32_t magic;   // DUCKD_FRAME_MAGIC
  uint16_t version; // DUCKD_PROTOCOL_VERSION
  uint16_t type;    // duckd_msg_type
  uint32_t flags;   // duckd_frame_flags
  uint32_t request_id; // chosen by the host, echoed in the reply
  uint64_t payload_bytes;
  uint64_t payload_checksum; // XXH3-64 (seed 0) of the payload, or the
                             // frame's tag on an authenticated connection
} duckd_frame_header;

/// Error codes of an error reply. Append only.
typedef enum duckd_error_code {
  DUCKD_ERR_BAD_FRAME = 1,    // header or checksum invalid
  DUCKD_ERR_BAD_REQUEST = 2,  // payload malformed for its type
  DUCKD_ERR_BAD_ABI = 3,      // abi or protocol version mismatch
  DUCKD_ERR_UNAUTHORIZED = 4, // missing hello or wrong token
  DUCKD_ERR_BUSY = 5,         // another host holds this duckd
  DUCKD_ERR_NO_SESSION = 6,   // step/close without an open session
  DUCKD_ERR_BAD_ELF = 7,      // the ELF was refused by the loader
  DUCKD_ERR_STEP_CRASHED = 8, // the ELF faulted; the session is closed
  DUCKD_ERR_STEP_TIMEOUT = 9, // the step did not finish; session closed
  DUCKD_ERR_CACHE = 10,       // weight cache / prepare failure
  DUCKD_ERR_TOO_LARGE = 11,   // a size beyond a configured limit
  DUCKD_ERR_INTERNAL = 12,
  DUCKD_ERR_CAST_MISSED = 13,  // a cast step's datagrams did not all come
                               // (or duckd has no cast socket): send the
                               // step again as a plain step
  DUCKD_ERR_STAGE_MISSED = 14, // a DUCK_IB_STAGED step found no stage of
                               // its own before it (abi.h): send the
                               // whole step as a plain step
} duckd_error_code;

/// Payload of a frame with DUCKD_FLAG_ERROR: this header, then
/// `message_bytes` of UTF-8 text (not NUL-terminated).
typedef struct duckd_error {
  uint32_t code; // duckd_error_code
  uint32_t message_bytes;
} duckd_error;

/* hello: first call of every connection. ------------------------------- */

/// With a token, the hello frame is sealed with HMAC-SHA256(token, "duckd
/// hello" || nonce): the token itself never crosses the wire.
typedef struct duckd_hello_request {
  uint32_t abi_version;      // DUCK_ABI_VERSION the host was built with
  uint32_t protocol_version; // DUCKD_PROTOCOL_VERSION
  uint32_t auth;             // duckd_auth
  uint32_t reserved;
  uint8_t nonce[DUCKD_NONCE_BYTES]; // the host's, fresh for every hello
} duckd_hello_request;

typedef struct duckd_hello_reply {
  uint32_t abi_version;
  uint32_t protocol_version;
  uint32_t cores; // cores duckd runs a step on
  uint32_t pid;
  uint64_t memory_bytes;     // physical memory of the node
  uint64_t weights_capacity; // bytes the weight buffer holds
  uint64_t max_payload;
  uint64_t tsc_hz;
  uint64_t weights_generation;
  // Weight cache: the image it holds (all zero when empty) and its state.
  duck_image_header image;
  uint32_t cache_valid;   // 1 when `image` names a cached image
  uint32_t head_finished; // the image header + slot table verified
  uint32_t finished_slots; // count; the bitmap follows the reply
  uint32_t auth;           // duckd_auth of the connection from here on
  char name[DUCKD_NAME_BYTES]; // --name or the port, NUL-padded
  uint8_t nonce[DUCKD_NONCE_BYTES]; // duckd's, fresh for every hello
  // followed by a finish bitmap of ceil(image.slot_count / 8) bytes
} duckd_hello_reply;

/* open: load an ELF once for a persistent session. --------------------- */

typedef struct duckd_open_request {
  uint32_t cores; // 0: all of duckd's cores
  uint32_t flags; // reserved, 0
  uint64_t ib_limit;      // largest IB of the session
  uint64_t ob_limit;      // OB bytes each step may produce
  uint64_t scratch_bytes; // shared scratch (duck_step_scratch_bytes)
  uint64_t elf_bytes;     // followed by the ELF file
} duckd_open_request;

typedef struct duckd_open_reply {
  uint64_t session_id;
  uint32_t cores;
  uint32_t reserved;
  uint64_t tsc_hz;
} duckd_open_reply;

/* step / run ----------------------------------------------------------- */

typedef struct duckd_step_request {
  uint64_t session_id;
  uint64_t ib_bytes; // followed by the IB
} duckd_step_request;

/// run: load + run + unload, no session. Followed by the ELF, then the IB.
typedef struct duckd_run_request {
  uint32_t cores;
  uint32_t flags; // reserved, 0
  uint64_t ob_limit;
  uint64_t scratch_bytes;
  uint64_t elf_bytes;
  uint64_t ib_bytes;
} duckd_run_request;

/// Reply of step and run: this, then uint64 kernel_ns[cores] (each core's
/// time inside the ELF, from its TSC ticks), the OB, then the log text
/// (all cores' logs, core 0 first).
typedef struct duckd_step_reply {
  int32_t status; // duck_status returned by core 0
  uint32_t cores;
  uint64_t ob_bytes;
  uint64_t log_bytes;
  uint64_t worker_ns; // duckd's wall time from IB ready to OB ready
} duckd_step_reply;

/* prepare: weight upload into the cached weight buffer. ---------------- */

typedef enum duckd_prepare_flags {
  DUCKD_PREPARE_INVALIDATE = 1u << 0, // forget the cache: always a miss
} duckd_prepare_flags;

typedef enum duckd_cache_result {
  DUCKD_CACHE_HIT = 0,     // same image, every slot finished: no upload
  DUCKD_CACHE_PARTIAL = 1, // same image, some parts unfinished: upload those
  DUCKD_CACHE_MISS = 2,    // different image or invalidated: upload all
} duckd_cache_result;

typedef struct duckd_prepare_begin_request {
  uint32_t flags; // duckd_prepare_flags
  uint32_t reserved;
  duck_image_header image; // the header of the image to hold
} duckd_prepare_begin_request;

/// Reply of prepare_begin and prepare_finish; followed by the finish
/// bitmap (ceil(slot_count / 8) bytes, bit s % 8 of byte s / 8).
typedef struct duckd_prepare_reply {
  uint32_t result; // duckd_cache_result (begin), 0 (finish)
  uint32_t head_finished;
  uint32_t slot_count;
  uint32_t finished_slots;
  uint64_t generation;
} duckd_prepare_reply;

/// Followed by `bytes` of image data for image offset `offset`.
typedef struct duckd_prepare_write_request {
  uint64_t offset;
  uint64_t bytes;
} duckd_prepare_write_request;

typedef struct duckd_prepare_write_reply {
  uint64_t offset;
  uint64_t bytes;
} duckd_prepare_write_reply;

typedef struct duckd_close_request {
  uint64_t session_id;
} duckd_close_request;

/* measure: the duck's read bandwidth and fp9 GEMV rates. --------------- */

typedef enum duckd_measure_flags {
  DUCKD_MEASURE_PING = 1u << 0, // answer at once (a round-trip probe)
  /// A link probe (added within protocol 5, sent only by
  /// duck-measure-cluster --links): the request is the struct, then a
  /// uint64 `reply_bytes` (at most DUCKD_LINK_PROBE_MAX_BYTES), then any
  /// number of bytes duckd reads and discards; the reply is a zeroed
  /// duckd_measure_reply followed by reply_bytes zero bytes, sent at once.
  /// Timed with and without bytes each way, it gives the link's rates. A
  /// duckd from before it answers bad_request "measure has the wrong size".
  DUCKD_MEASURE_LINK = 1u << 1,
} duckd_measure_flags;

enum { DUCKD_LINK_PROBE_MAX_BYTES = 64 << 20 };

enum { DUCKD_MEASURE_KERNELS = 8 }; // room for duck_kernel_id values

typedef struct duckd_measure_request {
  uint32_t cores;       // 0: all of duckd's
  uint32_t flags;       // duckd_measure_flags
  uint64_t arena_bytes; // memory the cold copies cycle through (0: 1 GiB)
  uint32_t millis;      // budget of each measurement (0: 150)
  uint32_t busy_us;     // PING: duckd stays busy this long (at most 100000)
                        // before it answers, as a duck computing a step
} duckd_measure_request;

/// Rates measured with the duck's kernels on memory of duckd's own (the
/// weight cache is not touched); zeros for PING. The GEMM rate (protocol
/// 3) is a prompt chunk's: dense prefill of gemm_tokens rows through a
/// [gemm_hidden, gemm_inter] FFN, multiply-adds a second / 1e9.
typedef struct duckd_measure_reply {
  uint32_t cores;
  uint32_t kernels;  // entries of gparam_s that are filled (duck_kernel_id)
  double read_gbs;   // streaming read over `cores`
  double gparam_s[DUCKD_MEASURE_KERNELS]; // cold fp9 GEMV by duck_kernel_id
  uint32_t rows[DUCKD_MEASURE_KERNELS], k[DUCKD_MEASURE_KERNELS]; // shapes
  double other_load; // cores' worth other processes used meanwhile (NaN:
                     // unknown)
  double seconds;    // how long it took
  double gemm_gmac_s;
  uint32_t gemm_tokens, gemm_hidden, gemm_inter;
  /// What one cold GEMV call costs beyond its weights at the general128
  /// rate (the start of its streams, its tail), nanoseconds; 0: not
  /// measured (duckds before it left this word zero).
  uint32_t gemv_call_ns;
} duckd_measure_reply;

/* stats: the duck's counters. ------------------------------------------ */

/// Reply of `stats` (an empty request). Added within protocol 3: a host
/// sends it only when asked, and a duckd from before it answers
/// bad_frame "unknown message type 11" and closes the connection. Fields
/// are only appended: a host reads the fields it knows from a longer reply.
typedef struct duckd_stats_reply {
  /// The memory scrub (duckd --scrub-mbps): the finished parts of the
  /// weight cache hashed again while the duck is idle.
  uint64_t scrub_bytes_per_second; // its rate; 0: the scrub is off
  uint64_t scrub_passes;           // full passes over every finished part
  uint64_t scrub_slots;            // slots hashed whole
  uint64_t scrub_bytes;            // bytes hashed
  uint64_t scrub_damaged;          // parts found damaged (then unfinished)
  uint64_t scrub_last_pass_unix_ms; // when the last full pass ended; 0: none
  uint64_t scrub_last_pass_ms;      // how long it took
  uint32_t damaged_slots;  // slots flagged damaged now (until re-uploaded)
  uint32_t finished_slots; // slots finished now
  uint64_t reserved[4];
} duckd_stats_reply;

/* step_cast: a step whose IB came as datagrams. ------------------------ */

/// Added within protocol 3, sent only when asked (duckrun with a plan
/// whose fanout is multicast). The host sends a step's IB once, as UDP
/// datagrams to the ducks' cast address (an IP multicast group, or a
/// relay such as duck-linksim's that copies it to every duck), then each
/// duck this small frame over its connection. The duck takes the
/// datagrams of `cast_id` from its cast socket (duckd --cast) into the
/// session's IB, checks them against `digest` (XXH3-64 in its first 8
/// bytes on an unkeyed connection; SHA-256 on a keyed one, whose frame
/// seals the digest), and runs the step: the reply is a step reply (type
/// step_cast). A batch that is not whole within the duck's wait (or a
/// duckd without a cast socket) answers DUCKD_ERR_CAST_MISSED, and the
/// host sends that duck the step again as a plain step.
enum {
  DUCKD_CAST_MAGIC = 0x54534344u,       // "DCST" little-endian
  DUCKD_CAST_STAGE_MAGIC = 0x53534344u, // "DCSS": a cast stage's batch
  DUCKD_CAST_DIGEST_BYTES = 32,
  DUCKD_CAST_MAX_DATAGRAM = 65507, // UDP's largest payload over IPv4
};
typedef struct duckd_step_cast_request {
  uint64_t session_id;
  uint64_t cast_id;        // the batch's datagrams carry it
  uint64_t ib_bytes;       // the IB the datagrams carry, in order
  uint32_t datagrams;      // in the batch
  uint32_t datagram_bytes; // each one's payload (the last: the rest)
  uint8_t digest[DUCKD_CAST_DIGEST_BYTES];
} duckd_step_cast_request;

/// step_staged (protocol 5): a staged step (abi.h DUCK_IB_STAGED) whose
/// stage came as a cast batch alone, with no frame of its own: the batch's
/// datagrams carry DUCKD_CAST_STAGE_MAGIC, and a duck runs the stage as
/// soon as the batch is whole. This frame carries the staged step's IB
/// (the routed slots) and names its stage: the batch's id, shape and
/// digest (as step_cast's). The stage's results are used only when the
/// batch the duck ran is this one and matches the digest; else the duck
/// takes the batch now (within its cast wait) and runs it, or answers
/// DUCKD_ERR_STAGE_MISSED. The reply is a step reply (type step_staged).
typedef struct duckd_step_staged_request {
  uint64_t session_id;
  uint64_t ib_bytes;       // the staged step's IB, after this request
  uint64_t cast_id;        // the stage's batch
  uint64_t stage_ib_bytes; // the stage's IB the datagrams carry
  uint32_t datagrams;      // in the stage's batch
  uint32_t datagram_bytes; // each one's payload (the last: the rest)
  uint8_t digest[DUCKD_CAST_DIGEST_BYTES]; // the stage's IB's
} duckd_step_staged_request;

/// A cast datagram: this header, then `bytes` of the IB at offset
/// index x the request's datagram_bytes.
typedef struct duckd_cast_datagram {
  uint32_t magic; // DUCKD_CAST_MAGIC (a stage's: DUCKD_CAST_STAGE_MAGIC)
  uint32_t index; // 0 .. count - 1
  uint32_t count;
  uint32_t bytes;
  uint64_t cast_id;
} duckd_cast_datagram;

/* mesh: join the ducks' mesh. ------------------------------------------ */

/// Added within protocol 3, sent only when asked. duckd (started with
/// --mesh-port) connects to every other duck of the request's list over
/// its mesh listener (duck_rt/peer_mesh.h; with duckd's --token every pair
/// proves it), then sums every duck's `check` with an all-reduce over the
/// new links and answers the sum: the host sees the whole mesh carry data.
/// Over datagrams (`transport` DUCKD_MESH_UDP) the ducks settle the check
/// (every duck has it) before they answer. The mesh stays up until the
/// next mesh request or duckd's exit; no step uses it yet.
enum { DUCKD_MESH_HOST_BYTES = 64 };
enum { DUCKD_MESH_TCP = 0, DUCKD_MESH_UDP = 1 };
typedef struct duckd_mesh_peer {
  char host[DUCKD_MESH_HOST_BYTES]; // IPv4 address, NUL-padded
  uint32_t port;                    // that duck's mesh listener
  uint32_t reserved;
} duckd_mesh_peer;

typedef struct duckd_mesh_request {
  uint32_t rank, ducks; // this duck's rank; followed by `ducks` peers
  uint32_t groups;      // two-level collectives over this many (1: none)
  uint32_t timeout_ms;  // for the whole join (0: 30000; at most 60000)
  uint64_t session;     // every duck of one mesh gets the same
  float check;          // summed over the mesh once it is up
  uint32_t transport;   // DUCKD_MESH_TCP (0) or DUCKD_MESH_UDP
} duckd_mesh_request;

typedef struct duckd_mesh_reply {
  float check_sum; // every duck's `check`, summed in rank order
  uint32_t groups;
  uint64_t bytes_sent; // by this duck in the check
} duckd_mesh_reply;

/* mesh_probe: time collectives over the joined mesh. ------------------- */

/// Added within protocol 3 with `mesh`, sent only when asked, to every duck
/// of the mesh at once: each runs `rounds` pairs of a reduce-scatter and an
/// all-gather of `values` values on the mesh the last `mesh` request
/// joined, in `groups` (1: one direct exchange; a divisor of the duck
/// count; the mesh's own groups again afterwards), then settles, and
/// answers the time it took: what a collective's calls cost on this duck
/// (duck-measure-cluster --mesh). A duckd with no mesh refuses by name.
typedef struct duckd_mesh_probe_request {
  uint32_t rounds; // 1 to 100000
  uint32_t values; // a collective's vector, 1 to 1 << 20
  uint32_t groups; // 0: the mesh's own
  uint32_t wire;   // 0: fp32, 1: bf16
} duckd_mesh_probe_request;

typedef struct duckd_mesh_probe_reply {
  uint32_t collectives; // 2 x rounds
  uint32_t groups;
  uint64_t wall_ns; // this duck's, for all of them and the settle
  uint64_t cpu_ns;  // the serving thread's (user and system)
  uint64_t bytes_sent;
} duckd_mesh_probe_reply;

#ifdef __cplusplus
} // extern "C"

static_assert(sizeof(duckd_stats_reply) == 96, "duckd_stats_reply is wire");
static_assert(sizeof(duckd_step_cast_request) == 64,
              "duckd_step_cast_request is wire");
static_assert(sizeof(duckd_cast_datagram) == 24, "duckd_cast_datagram is wire");
static_assert(sizeof(duckd_step_staged_request) == 72,
              "duckd_step_staged_request is wire");
static_assert(sizeof(duckd_mesh_peer) == 72, "duckd_mesh_peer is wire");
static_assert(sizeof(duckd_mesh_request) == 32, "duckd_mesh_request is wire");
static_assert(sizeof(duckd_mesh_reply) == 16, "duckd_mesh_reply is wire");
static_assert(sizeof(duckd_mesh_probe_request) == 16,
              "duckd_mesh_probe_request is wire");
static_assert(sizeof(duckd_mesh_probe_reply) == 32,
              "duckd_mesh_probe_reply is wire");
static_assert(sizeof(duckd_frame_header) == 32, "duckd_frame_header is wire");
static_assert(sizeof(duckd_error) == 8, "duckd_error is wire");
static_assert(sizeof(duckd_hello_request) == 32, "duckd_hello_request is wire");
static_assert(sizeof(duckd_hello_reply) == 232, "duckd_hello_reply is wire");
static_assert(sizeof(duckd_open_request) == 40, "duckd_open_request is wire");
static_assert(sizeof(duckd_open_reply) == 24, "duckd_open_reply is wire");
static_assert(sizeof(duckd_step_request) == 16, "duckd_step_request is wire");
static_assert(sizeof(duckd_run_request) == 40, "duckd_run_request is wire");
static_assert(sizeof(duckd_step_reply) == 32, "duckd_step_reply is wire");
static_assert(sizeof(duckd_prepare_begin_request) == 88,
              "duckd_prepare_begin_request is wire");
static_assert(sizeof(duckd_prepare_reply) == 24, "duckd_prepare_reply is wire");
static_assert(sizeof(duckd_prepare_write_request) == 16,
              "duckd_prepare_write_request is wire");
static_assert(sizeof(duckd_prepare_write_reply) == 16,
              "duckd_prepare_write_reply is wire");
static_assert(sizeof(duckd_close_request) == 8, "duckd_close_request is wire");
static_assert(sizeof(duckd_measure_request) == 24,
              "duckd_measure_request is wire");
static_assert(sizeof(duckd_measure_reply) == 184,
              "duckd_measure_reply is wire");
#endif

#endif // DUCK_RT_DUCKD_PROTOCOL_H
