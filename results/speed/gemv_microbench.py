import time, jax, jax.numpy as jnp
L, E, F = 30, 576, 1536
def bench(name, fn, x, ws, n=20):
  f = jax.jit(fn); jax.block_until_ready(f(x, ws))
  t = time.perf_counter()
  for _ in range(n): jax.block_until_ready(f(x, ws))
  dt = (time.perf_counter() - t) / n
  nbytes = sum(w.nbytes for w in ws)
  print(f"{name:40s} {dt*1e3:7.2f} ms  {nbytes/dt/1e9:6.1f} GB/s")
key = jax.random.key(0)
for dt in (jnp.bfloat16, jnp.float32):
  ws = [jax.random.normal(jax.random.fold_in(key, l), (F, E), dt) for l in range(L)]
  wts = [w.T.copy() for w in ws]
  for m in (1, 2, 8, 32):
    x = jax.random.normal(key, (m, E), dt)
    def oi(x, ws, acc=jnp.float32):
      h = x
      for w in ws:
        y = jnp.einsum("mi,oi->mo", h, w, preferred_element_type=acc)
        h = h + y[:, :E].astype(h.dtype)
      return h
    def io(x, ws):
      h = x
      for w in ws:
        y = jnp.einsum("mi,io->mo", h, w, preferred_element_type=jnp.float32)
        h = h + y[:, :E].astype(h.dtype)
      return h
    def oi_upcast(x, ws):
      h = x.astype(jnp.float32)
      for w in ws:
        y = jnp.einsum("mi,oi->mo", h, w.astype(jnp.float32))
        h = h + y[:, :E]
      return h
    bench(f"{jnp.dtype(dt).name} m{m} [o,i]", oi, x, ws)
    bench(f"{jnp.dtype(dt).name} m{m} [i,o]", io, x, wts)
    if dt == jnp.bfloat16:
      bench(f"{jnp.dtype(dt).name} m{m} [o,i] upcast", oi_upcast, x, ws)
      bench(f"{jnp.dtype(dt).name} m{m} [o,i] bf16 acc", lambda x, ws: oi(x, ws, jnp.bfloat16), x, ws)
