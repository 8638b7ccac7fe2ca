// duck-reference: an independent, simple reference forward pass for the
// tests. Reads the checkpoint directly (safetensors, FP8 dequantised per
// block), computes in double precision, no fp9, no ducks, no code shared
// with the runtime. Qwen3 dense and Qwen3-MoE.
//
//   duck-reference <model-dir> --prompt-ids 1,2,3 [--generate N]
//                  [--logits-out FILE]
// prints the greedy continuation's ids; --logits-out writes the logits of
// the last prompt token as raw float32.
#include "duck/Import/Checkpoint.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <vector>

using namespace llvm;
using namespace mlir::duck::import;

namespace {

cl::opt<std::string> modelDir(cl::Positional, cl::Required, cl::desc("<model-dir>"));
cl::list<int> promptIds("prompt-ids", cl::CommaSeparated, cl::desc("prompt ids"));
cl::opt<unsigned> generate("generate", cl::init(0), cl::desc("greedy tokens"));
cl::opt<std::string> logitsOut("logits-out", cl::desc("raw f32 logits file"));

using Vec = std::vector<double>;

struct Tensor {
  std::vector<int64_t> shape;
  Vec v;
};

class Model {
public:
  explicit Model(const Checkpoint &c) : ckpt(c), d(c.model()) {}

  const Tensor &get(const std::string &name) {
    auto it = cache.find(name);
    if (it != cache.end())
      return it->second;
    TensorRef r = ckpt.find(name);
    if (!r) {
      errs() << "duck-reference: missing tensor " << name << "\n";
      exit(1);
    }
    Tensor t;
    t.shape = r.info->shape;
    size_t n = r.info->numElements();
    t.v.resize(n);
    const uint8_t *p = r.data().data();
    for (size_t i = 0; i < n; ++i) {
      switch (r.info->dtype) {
      case DType::F32: {
        float f;
        std::memcpy(&f, p + 4 * i, 4);
        t.v[i] = f;
        break;
      }
      case DType::BF16: {
        uint32_t b = (uint32_t)(p[2 * i] | (p[2 * i + 1] << 8)) << 16;
        float f;
        std::memcpy(&f, &b, 4);
        t.v[i] = f;
        break;
      }
      case DType::F8_E4M3: {
        uint8_t b = p[i];
        int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
        double val = e == 0 ? m / 8.0 * std::pow(2.0, -6)
                            : (1 + m / 8.0) * std::pow(2.0, e - 7);
        t.v[i] = s ? -val : val;
        break;
      }
      default:
        errs() << "duck-reference: unsupported dtype in " << name << "\n";
        exit(1);
      }
    }
    if (r.info->dtype == DType::F8_E4M3) {
      const Tensor &s = get(name + "_scale_inv");
      int64_t rows = t.shape[0], cols = t.shape[1];
      int64_t sc = s.shape[1];
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j)
          // Same fp32 product as the checkpoint's own dequantisation.
          t.v[i * cols + j] =
              (float)((float)t.v[i * cols + j] * (float)s.v[(i / 128) * sc + j / 128]);
    }
    return cache.emplace(name, std::move(t)).first->second;
  }

  Vec matvec(const std::string &name, const Vec &x) {
    const Tensor &w = get(name);
    int64_t rows = w.shape[0], cols = w.shape[1];
    Vec y(rows, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t c = 0; c < cols; ++c)
        s += w.v[r * cols + c] * x[c];
      y[r] = s;
    }
    return y;
  }

  Vec rmsnorm(const Vec &x, const std::string &w, size_t off = 0,
              size_t n = 0) {
    n = n ? n : x.size();
    const Tensor &g = get(w);
    double ss = 0;
    for (size_t i = 0; i < n; ++i)
      ss += x[off + i] * x[off + i];
    double inv = 1.0 / std::sqrt(ss / n + d.rms_norm_eps);
    Vec y(n);
    for (size_t i = 0; i < n; ++i)
      y[i] = g.v[i] * x[off + i] * inv;
    return y;
  }

  void rope(double *h, int64_t dim, int64_t pos) {
    for (int64_t i = 0; i < dim / 2; ++i) {
      double a = pos * std::pow(d.rope_theta, -2.0 * i / dim);
      double x0 = h[i], x1 = h[i + dim / 2];
      h[i] = x0 * std::cos(a) - x1 * std::sin(a);
      h[i + dim / 2] = x1 * std::cos(a) + x0 * std::sin(a);
    }
  }

  static double silu(double g) { return g / (1 + std::exp(-g)); }

  Vec ffn(const std::string &p, const Vec &x) {
    Vec g = matvec(p + "gate_proj.weight", x), u = matvec(p + "up_proj.weight", x);
    for (size_t i = 0; i < g.size(); ++i)
      g[i] = silu(g[i]) * u[i];
    return matvec(p + "down_proj.weight", g);
  }

  /// Logits of one token at position `pos` (KV cache appended).
  Vec step(int tok, int64_t pos) {
    const int64_t H = d.hidden_size, nh = d.num_attention_heads,
                  nkv = d.num_kv_heads, hd = d.head_dim;
    const Tensor &emb = get("model.embed_tokens.weight");
    Vec x(emb.v.begin() + tok * H, emb.v.begin() + (tok + 1) * H);
    if (kcache.empty()) {
      kcache.resize(d.num_layers);
      vcache.resize(d.num_layers);
    }
    for (int64_t l = 0; l < d.num_layers; ++l) {
      std::string p = "model.layers." + std::to_string(l) + ".";
      Vec h = rmsnorm(x, p + "input_layernorm.weight");
      Vec q = matvec(p + "self_attn.q_proj.weight", h);
      Vec k = matvec(p + "self_attn.k_proj.weight", h);
      Vec v = matvec(p + "self_attn.v_proj.weight", h);
      for (int64_t i = 0; i < nh; ++i) {
        Vec n = rmsnorm(q, p + "self_attn.q_norm.weight", i * hd, hd);
        std::copy(n.begin(), n.end(), q.begin() + i * hd);
        rope(&q[i * hd], hd, pos);
      }
      for (int64_t i = 0; i < nkv; ++i) {
        Vec n = rmsnorm(k, p + "self_attn.k_norm.weight", i * hd, hd);
        std::copy(n.begin(), n.end(), k.begin() + i * hd);
        rope(&k[i * hd], hd, pos);
      }
      kcache[l].push_back(k);
      vcache[l].push_back(v);
      Vec attn(nh * hd, 0.0);
      for (int64_t i = 0; i < nh; ++i) {
        int64_t kv = i / (nh / nkv);
        std::vector<double> s(kcache[l].size());
        double mx = -1e300;
        for (size_t t = 0; t < s.size(); ++t) {
          double dot = 0;
          for (int64_t j = 0; j < hd; ++j)
            dot += q[i * hd + j] * kcache[l][t][kv * hd + j];
          s[t] = dot / std::sqrt((double)hd);
          mx = std::max(mx, s[t]);
        }
        double sum = 0;
        for (double &e : s)
          sum += (e = std::exp(e - mx));
        for (size_t t = 0; t < s.size(); ++t)
          for (int64_t j = 0; j < hd; ++j)
            attn[i * hd + j] += s[t] / sum * vcache[l][t][kv * hd + j];
      }
      Vec o = matvec(p + "self_attn.o_proj.weight", attn);
      for (int64_t i = 0; i < H; ++i)
        x[i] += o[i];
      h = rmsnorm(x, p + "post_attention_layernorm.weight");
      Vec f(H, 0.0);
      if (d.isMoeLayer(l)) {
        Vec logits = matvec(p + "mlp.gate.weight", h);
        double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
        for (double &e : logits)
          sum += (e = std::exp(e - mx));
        for (double &e : logits)
          e /= sum;
        std::vector<int> idx(logits.size());
        for (size_t i = 0; i < idx.size(); ++i)
          idx[i] = (int)i;
        std::stable_sort(idx.begin(), idx.end(),
                         [&](int a, int b) { return logits[a] > logits[b]; });
        double wsum = 0;
        for (int64_t j = 0; j < d.experts_per_tok; ++j)
          wsum += logits[idx[j]];
        for (int64_t j = 0; j < d.experts_per_tok; ++j) {
          double w = logits[idx[j]] / (d.norm_topk_prob ? wsum : 1.0);
          Vec e = ffn(p + "mlp.experts." + std::to_string(idx[j]) + ".", h);
          for (int64_t i = 0; i < H; ++i)
            f[i] += w * e[i];
        }
      } else {
        f = ffn(p + "mlp.", h);
      }
      for (int64_t i = 0; i < H; ++i)
        x[i] += f[i];
    }
    Vec n = rmsnorm(x, "model.norm.weight");
    bool tied = d.tie_word_embeddings && !ckpt.find("lm_head.weight");
    return matvec(tied ? "model.embed_tokens.weight" : "lm_head.weight", n);
  }

private:
  const Checkpoint &ckpt;
  const ModelDesc &d;
  std::map<std::string, Tensor> cache;
  std::vector<std::vector<Vec>> kcache, vcache;
};

} // namespace

int main(int argc, char **argv) {
  cl::ParseCommandLineOptions(argc, argv, "Duck's reference forward pass\n");
  auto ckpt = Checkpoint::open(modelDir);
  if (!ckpt) {
    errs() << "duck-reference: error: " << toString(ckpt.takeError()) << "\n";
    return 1;
  }
  if (!(*ckpt)->model().isQwen()) {
    errs() << "duck-reference: error: only Qwen3 and Qwen3-MoE\n";
    return 1;
  }
  if (promptIds.empty()) {
    errs() << "duck-reference: error: --prompt-ids is required\n";
    return 1;
  }
  Model m(**ckpt);
  Vec logits;
  int64_t pos = 0;
  for (int id : promptIds)
    logits = m.step(id, pos++);
  if (!logitsOut.empty()) {
    std::vector<float> f(logits.begin(), logits.end());
    std::ofstream o(logitsOut, std::ios::binary);
    o.write(reinterpret_cast<const char *>(f.data()), f.size() * 4);
  }
  std::vector<int> out;
  for (unsigned i = 0; i < generate; ++i) {
    int next = (int)(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    if (i + 1 < generate)
      logits = m.step(next, pos++);
  }
  for (size_t i = 0; i < out.size(); ++i)
    outs() << (i ? " " : "") << out[i];
  outs() << "\n";
  return 0;
}
