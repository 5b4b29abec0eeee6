// The extension's functions for Python. Each lets go of the GIL while it runs (as torch's own ops
// do), so the server's event loop answers clients while the engine thread is in a kernel.
#define STALLFREE_DEF(name) m.def(#name, &name, py::call_guard<py::gil_scoped_release>())

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  STALLFREE_DEF(decode_attention);
  STALLFREE_DEF(panel_linear);
  STALLFREE_DEF(uses_bf16_dot_products);
  STALLFREE_DEF(chunk_attention);
  STALLFREE_DEF(q8_panel_linear);
  STALLFREE_DEF(rms_norm);
  STALLFREE_DEF(rope_);
  STALLFREE_DEF(silu_mul);
  STALLFREE_DEF(decode_layers);
}
