// python/bindings/plot_bindings.cpp: mha._core's picture functions, a thin layer over
// mha/plot.h. The friendly Python entry points (show_heatmaps) are in
// python/mha/plot.py.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>

#include "bindings.h"
#include "convert.h"
#include "mha/error.h"
#include "mha/plot.h"

namespace py = pybind11;

namespace {

using mha::python::FloatArray;
using ByteArray = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;

py::array_t<uint8_t> image_to_numpy(const mha::plot::Image& im) {
  py::array_t<uint8_t> out({static_cast<py::ssize_t>(im.height), static_cast<py::ssize_t>(im.width),
                            py::ssize_t{4}});
  std::memcpy(out.mutable_data(), im.rgba.data(), im.rgba.size());
  return out;
}

// (H, W, 4) or (H, W, 3) uint8 -> Image (alpha 255 when there is none).
mha::plot::Image image_from_numpy(const ByteArray& a) {
  if (a.ndim() != 3 || (a.shape(2) != 3 && a.shape(2) != 4))
    mha::fail("write_png", "image: shape ",
              mha::shape_str(mha::Shape(a.shape(), a.shape() + a.ndim())), ", wanted (H, W, 4) or (H, W, 3)");
  mha::plot::Image im;
  im.height = static_cast<int>(a.shape(0));
  im.width = static_cast<int>(a.shape(1));
  const int c = static_cast<int>(a.shape(2));
  im.rgba.resize(static_cast<size_t>(im.width) * im.height * 4);
  const uint8_t* in = a.data();
  for (size_t p = 0; p < static_cast<size_t>(im.width) * im.height; ++p)
    for (int k = 0; k < 4; ++k) im.rgba[4 * p + k] = k < c ? in[c * p + k] : 255;
  return im;
}

py::tuple box(const mha::plot::Box& b) { return py::make_tuple(b.x, b.y, b.w, b.h); }

}  // namespace

void mha::python::add_plot_bindings(py::module_& m) {
  m.def(
      "_render_heatmaps",
      [](const py::object& weights, const std::string& xlabel, const std::string& ylabel,
         const std::vector<std::string>& titles, const std::vector<std::string>& row_labels,
         const std::string& title, const std::string& colorbar_label, const std::string& note,
         const py::object& vmin, const py::object& vmax, int64_t max_cells, int64_t panel_size) {
        const mha::Tensor t = mha::python::to_tensor(weights, "plot.render_heatmaps", "weights");
        mha::plot::HeatmapOptions opt;
        opt.xlabel = xlabel;
        opt.ylabel = ylabel;
        opt.titles = titles;
        opt.row_labels = row_labels;
        opt.title = title;
        opt.colorbar_label = colorbar_label;
        opt.note = note;
        opt.vmin = vmin.is_none() ? mha::plot::kAuto : mha::python::real_number(vmin, "plot.render_heatmaps", "vmin");
        opt.vmax = vmax.is_none() ? mha::plot::kAuto : mha::python::real_number(vmax, "plot.render_heatmaps", "vmax");
        opt.max_cells = mha::python::int_sized(max_cells, "plot.render_heatmaps", "max_cells");
        opt.panel_size = mha::python::int_sized(panel_size, "plot.render_heatmaps", "panel_size");
        mha::plot::Heatmaps h;
        {
          py::gil_scoped_release release;
          h = mha::plot::render_heatmaps(t, opt);
        }
        const mha::plot::HeatmapLayout& L = h.layout;
        py::list panels;
        for (const auto& p : L.panels) panels.append(box(p));
        py::dict layout;
        layout["rows"] = L.rows;
        layout["cols"] = L.cols;
        layout["queries"] = L.queries;
        layout["keys"] = L.keys;
        layout["q_block"] = L.q_block;
        layout["k_block"] = L.k_block;
        layout["cells_q"] = L.cells_q;
        layout["cells_k"] = L.cells_k;
        layout["cell_w"] = L.cell_w;
        layout["cell_h"] = L.cell_h;
        layout["panels"] = panels;
        layout["colorbar"] = box(L.colorbar);
        layout["mask_swatch"] = box(L.mask_swatch);
        layout["vmin"] = h.vmin;
        layout["vmax"] = h.vmax;
        layout["gap"] = L.gap;
        return py::make_tuple(image_to_numpy(h.image), layout);
      },
      py::arg("weights"), py::arg("xlabel"), py::arg("ylabel"), py::arg("titles"), py::arg("row_labels"),
      py::arg("title"), py::arg("colorbar_label"), py::arg("note"), py::arg("vmin"), py::arg("vmax"),
      py::arg("max_cells"), py::arg("panel_size"),
      "Low-level: weights (rows, cols, Q, K) float32, NaN = masked -> (image (H, W, 4) uint8, layout dict).\n"
      "Use mha.show_heatmaps.");
  m.def(
      "read_png", [](const std::string& path) { return image_to_numpy(mha::plot::read_png(path)); },
      py::arg("path"), "read_png(path) -> (H, W, 4) uint8 RGBA, decoded by cairo.");
  m.def(
      "write_png", [](const std::string& path, const py::object& image) {
        const py::array a = mha::python::real_array(image, "write_png", "image");
        if (!a.dtype().is(py::dtype::of<uint8_t>()))
          mha::python::fail(mha::python::kType, "write_png", "image: dtype ", std::string(py::str(a.dtype())),
                            ", wanted uint8");
        mha::plot::write_png(path, image_from_numpy(ByteArray::ensure(a)));
      },
      py::arg("path"), py::arg("image"),
      "write_png(path, image (H, W, 4 or 3) uint8): PNG through cairo, written atomically.");
  m.def(
      "colormap_table",
      [] {
        py::array_t<uint8_t> out({py::ssize_t{mha::plot::kColormapSize}, py::ssize_t{3}});
        for (int i = 0; i < mha::plot::kColormapSize; ++i) {
          const mha::plot::Rgb c = mha::plot::colormap_entry(i);
          out.mutable_at(i, 0) = c.r, out.mutable_at(i, 1) = c.g, out.mutable_at(i, 2) = c.b;
        }
        return out;
      },
      "The heatmaps' colour map: (256, 3) uint8; entry i is the fraction i / 255 of the colour scale.");
  m.attr("MASK_COLOR") = py::make_tuple(mha::plot::kMaskColor.r, mha::plot::kMaskColor.g, mha::plot::kMaskColor.b);
}
