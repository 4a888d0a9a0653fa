"""Decode attention alone (issue 25): 30 layers of one query a row over a [32, 3, 576, 64] bf16
KV cache, the sampler's `attend_decode` and the variants tried on 2026-12-04 (README.md)."""
import functools, time, jax, jax.numpy as jnp
B, KV, G, D, S, L = 32, 3, 3, 64, 576, 30
def bench(name, fn, *args, n=10):
  f = jax.jit(fn); jax.block_until_ready(f(*args))
  t = time.perf_counter()
  for _ in range(n): jax.block_until_ready(f(*args))
  dt = (time.perf_counter() - t) / n
  nbytes = sum(a.nbytes for a in jax.tree.leaves(args[1:]))
  print(f"{name:40s} {dt*1e3:7.2f} ms  {nbytes/dt/1e9:6.1f} GB/s", flush=True)
key = jax.random.key(0)
ks = [jax.random.normal(jax.random.fold_in(key, l), (B, KV, S, D), jnp.bfloat16) for l in range(L)]
vs = [jax.random.normal(jax.random.fold_in(key, 100 + l), (B, KV, S, D), jnp.bfloat16) for l in range(L)]
mask = jnp.ones((B, S), bool)
q0 = jax.random.normal(key, (B, KV, G, D), jnp.bfloat16)
NEG = jnp.finfo(jnp.float32).min
def current(q, ks, vs, mask, scores="bkgd,bksd->bkgs"):
  for k, v in zip(ks, vs):
    s = jnp.einsum(scores, q, k, preferred_element_type=jnp.float32) / 8.0
    s = jnp.where(mask[:, None, None], s, NEG)
    p = jax.nn.softmax(s, -1)
    o = jnp.einsum("bkgs,bksd->bkgd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    q = (q.astype(jnp.float32) + o).astype(q.dtype)
  return q
def mulred(q, ks, vs, mask):
  for k, v in zip(ks, vs):
    s = (q[:, :, :, None, :].astype(jnp.float32) * k[:, :, None].astype(jnp.float32)).sum(-1) / 8.0
    s = jnp.where(mask[:, None, None], s, NEG)
    p = jax.nn.softmax(s, -1)
    o = (p[..., None] * v[:, :, None].astype(jnp.float32)).sum(-2)
    q = (q.astype(jnp.float32) + o).astype(q.dtype)
  return q
def f32dots(q, ks, vs, mask):
  for k, v in zip(ks, vs):
    s = jnp.einsum("bkgd,bksd->bkgs", q.astype(jnp.float32), k.astype(jnp.float32)) / 8.0
    s = jnp.where(mask[:, None, None], s, NEG)
    p = jax.nn.softmax(s, -1)
    o = jnp.einsum("bkgs,bksd->bkgd", p, v.astype(jnp.float32))
    q = (q.astype(jnp.float32) + o).astype(q.dtype)
  return q
def flatbk(q, ks, vs, mask):  # (b,k) merged into one batch dim
  for k, v in zip(ks, vs):
    qq = q.reshape(B * KV, G, D); kk = k.reshape(B * KV, S, D); vv = v.reshape(B * KV, S, D)
    s = jnp.einsum("ngd,nsd->ngs", qq, kk, preferred_element_type=jnp.float32) / 8.0
    s = jnp.where(jnp.repeat(mask, KV, 0)[:, None], s, NEG)
    p = jax.nn.softmax(s, -1)
    o = jnp.einsum("ngs,nsd->ngd", p.astype(vv.dtype), vv, preferred_element_type=jnp.float32)
    q = (q.astype(jnp.float32) + o.reshape(B, KV, G, D)).astype(q.dtype)
  return q
def scores_only(q, ks, vs, mask):
  acc = jnp.zeros((B, KV, G, S), jnp.float32)
  for k in ks:
    acc += jnp.einsum("bkgd,bksd->bkgs", q, k, preferred_element_type=jnp.float32)
  return acc
def pv_only(q, ks, vs, mask):
  p = jnp.ones((B, KV, G, S), jnp.bfloat16) / S
  acc = jnp.zeros((B, KV, G, D), jnp.float32)
  for v in vs:
    acc += jnp.einsum("bkgs,bksd->bkgd", p, v, preferred_element_type=jnp.float32)
  return acc
bench("current", current, q0, ks, vs, mask)
bench("scores only", scores_only, q0, ks, vs, mask)
bench("pv only", pv_only, q0, ks, vs, mask)
bench("f32 dots", f32dots, q0, ks, vs, mask)
bench("flat (b,k)", flatbk, q0, ks, vs, mask)
bench("mulred", mulred, q0, ks, vs, mask)
def late_norm(q, ks, vs, mask):
  for k, v in zip(ks, vs):
    s = jnp.einsum("bkgd,bksd->bkgs", q, k, preferred_element_type=jnp.float32)
    s = jnp.where(mask[:, None, None], s, NEG)
    m = s.max(-1, keepdims=True)
    e = jnp.exp((s - m) / 8.0)
    o = jnp.einsum("bkgs,bksd->bkgd", e.astype(v.dtype), v, preferred_element_type=jnp.float32)
    o = o / e.sum(-1, keepdims=True)
    q = (q.astype(jnp.float32) + o).astype(q.dtype)
  return q
def no_softmax(q, ks, vs, mask):
  for k, v in zip(ks, vs):
    s = jnp.einsum("bkgd,bksd->bkgs", q, k, preferred_element_type=jnp.float32)
    o = jnp.einsum("bkgs,bksd->bkgd", s.astype(v.dtype), v, preferred_element_type=jnp.float32)
    q = (q.astype(jnp.float32) + o).astype(q.dtype)
  return q
def indep(q, ks, vs, mask):  # no chain between layers
  acc = jnp.zeros((B, KV, G, D), jnp.float32)
  for k, v in zip(ks, vs):
    s = jnp.einsum("bkgd,bksd->bkgs", q, k, preferred_element_type=jnp.float32) / 8.0
    s = jnp.where(mask[:, None, None], s, NEG)
    p = jax.nn.softmax(s, -1)
    acc += jnp.einsum("bkgs,bksd->bkgd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
  return acc
bench("late norm", late_norm, q0, ks, vs, mask)
bench("no softmax", no_softmax, q0, ks, vs, mask)
bench("independent layers", indep, q0, ks, vs, mask)
def swapped(q, ks, vs, mask):
  for k, v in zip(ks, vs):
    s = jnp.einsum("bksd,bkgd->bksg", k, q, preferred_element_type=jnp.float32) / 8.0
    s = jnp.where(mask[:, None, :, None], s, NEG)
    p = jax.nn.softmax(s, -2)
    o = jnp.einsum("bksg,bksd->bkgd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    q = (q.astype(jnp.float32) + o).astype(q.dtype)
  return q
def split(n):
  def f(q, ks, vs, mask):
    for k, v in zip(ks, vs):
      outs = []
      for i in range(n):
        sl = slice(i * B // n, (i + 1) * B // n)
        s = jnp.einsum("bkgd,bksd->bkgs", q[sl], k[sl], preferred_element_type=jnp.float32) / 8.0
        s = jnp.where(mask[sl, None, None], s, NEG)
        p = jax.nn.softmax(s, -1)
        outs.append(jnp.einsum("bkgs,bksd->bkgd", p.astype(v.dtype), v[sl], preferred_element_type=jnp.float32))
      q = (q.astype(jnp.float32) + jnp.concatenate(outs)).astype(q.dtype)
    return q
  return f
bench("swapped", swapped, q0, ks, vs, mask)
bench("split 2", split(2), q0, ks, vs, mask)
bench("split 4", split(4), q0, ks, vs, mask)
# Session 65 (2026-12-07): three more.
kts = [jnp.swapaxes(k, -1, -2) for k in ks]  # [B, KV, D, S]
keys_t = functools.partial(current, scores="bkgd,bkds->bkgs")  # keys as [B, KV, D, S]
def bf16_acc(q, ks, vs, mask):  # bf16 outputs from the dots
  for k, v in zip(ks, vs):
    s = jnp.einsum("bkgd,bksd->bkgs", q, k).astype(jnp.float32) / 8.0
    s = jnp.where(mask[:, None, None], s, NEG)
    p = jax.nn.softmax(s, -1)
    o = jnp.einsum("bkgs,bksd->bkgd", p.astype(v.dtype), v).astype(jnp.float32)
    q = (q.astype(jnp.float32) + o).astype(q.dtype)
  return q
def per_head(q, ks, vs, mask):  # three independent kv-head chains per layer
  for k, v in zip(ks, vs):
    outs = []
    for h in range(KV):
      s = jnp.einsum("bgd,bsd->bgs", q[:, h], k[:, h], preferred_element_type=jnp.float32) / 8.0
      s = jnp.where(mask[:, None], s, NEG)
      p = jax.nn.softmax(s, -1)
      outs.append(jnp.einsum("bgs,bsd->bgd", p.astype(v.dtype), v[:, h], preferred_element_type=jnp.float32))
    q = (q.astype(jnp.float32) + jnp.stack(outs, 1)).astype(q.dtype)
  return q
bench("keys transposed [B,KV,D,S]", keys_t, q0, kts, vs, mask)
bench("bf16 dot outputs", bf16_acc, q0, ks, vs, mask)
bench("per kv head", per_head, q0, ks, vs, mask)
