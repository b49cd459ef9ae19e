// Predict: pick a model reference, drop or choose images, see each image's top-k classes,
// and, on demand, where the net looked (its Grad-CAM heatmap over the image).

import { api, query } from "./api.js";
import { h, notice, shortId } from "./ui.js";

export async function render(view, ctx) {
  const refs = h("datalist", { id: "model-refs" });
  const model = h("input", {
    name: "model",
    list: "model-refs",
    required: true,
    placeholder: "name, name@production, name/3 or a job id",
    size: 40,
    value: ctx.params.get("model") ?? "",
  });
  const topK = h("input", { name: "top_k", type: "number", min: 1, max: 100, value: 5 });
  const files = h("input", { type: "file", name: "files", accept: "image/*", multiple: true });
  const drop = h("div.drop", { id: "drop" }, "Drop images here, or ", files);
  const results = h("div", { id: "predictions" });
  const run = async (chosen) => {
    results.replaceChildren(h("p.muted", {}, "Predicting…"));
    const form = new FormData();
    for (const file of chosen) form.append("files", file, file.name);
    try {
      const answer = await api(
        `/predict${query({ model: model.value.trim(), top_k: topK.value })}`,
        { method: "POST", form },
      );
      results.replaceChildren(...drawAnswer(answer, chosen, model.value.trim()));
    } catch (error) {
      results.replaceChildren(notice(error.message, true));
    }
  };
  files.addEventListener("change", () => files.files.length && run([...files.files]));
  drop.addEventListener("dragover", (e) => {
    e.preventDefault();
    drop.classList.add("over");
  });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    if (e.dataTransfer.files.length) run([...e.dataTransfer.files]);
  });
  view.append(
    h("h1", {}, "Predict"),
    h("div.card.row", {}, h("label", {}, "model", model), refs, h("label", {}, "top k", topK)),
    drop,
    h("h2", {}, "Top classes"),
    results,
  );
  suggestRefs(refs, ctx).catch(() => {}); // suggestions only: the field takes any reference
}

async function suggestRefs(list, ctx) {
  // Suggestions from the first 200 models by name; the field takes any reference.
  const registered = (await api("/registry?limit=200", { signal: ctx.signal })).items;
  const options = registered.flatMap((m) => [
    m.name,
    ...m.aliases.map((a) => `${m.name}@${a.alias}`),
    ...m.versions.map((v) => `${m.name}/${v.version}`),
  ]);
  list.replaceChildren(...options.map((value) => h("option", { value })));
}

function drawAnswer(answer, chosen, ref) {
  const served = answer.model;
  const header = h(
    "p.muted",
    { id: "served" },
    [
      `model ${served.ref}`,
      served.version ? `${served.name} version ${served.version}` : null,
      `run ${shortId(served.job_id)}`,
      `step ${served.step}`,
      `sha256 ${served.sha256.slice(0, 12)}`,
      `input ${answer.preprocessing.input_size.join("×")}×${answer.preprocessing.channels}`,
      `${answer.timing.total_ms.toFixed(1)} ms`,
    ]
      .filter(Boolean)
      .join(" · "),
  );
  return [
    header,
    ...answer.results.map((image, i) => {
      const file = chosen[i];
      const best = image.top_k[0];
      return h(
        "div.card.pred",
        { dataset: { file: image.file } },
        file ? picture(file, image) : null,
        h(
          "div",
          {},
          h(
            "div.muted",
            {},
            image.file,
            image.resize && image.resize !== "none" ? ` (${image.resize})` : "",
          ),
          image.error ? h("p.error", {}, `${image.error.status}: ${image.error.message}`) : null,
          file && !image.error ? explainControls(file, ref) : null,
          best
            ? h(
                "div.top-class",
                { dataset: { label: best.label } },
                best.label,
                h("span.muted", {}, ` ${(100 * best.probability).toFixed(1)}%`),
              )
            : null,
          h(
            "table",
            {},
            h(
              "tbody",
              {},
              image.top_k.map((c) =>
                h(
                  "tr",
                  {},
                  h("td", {}, c.label),
                  h("td.num", {}, `${(100 * c.probability).toFixed(2)}%`),
                  h(
                    "td",
                    { style: "width:200px" },
                    h("div.bar", { style: `width:${100 * c.probability}%` }),
                  ),
                ),
              ),
            ),
          ),
        ),
      );
    }),
  ];
}

function picture(file, image) {
  // The image, with room for its heatmap's canvas laid over it.
  return h(
    "div.picture",
    { style: "position:relative;width:96px;height:96px;flex:none" },
    h("img", { src: URL.createObjectURL(file), alt: image.file }),
  );
}

function explainControls(file, ref) {
  // A toggle that asks POST /explain once, then shows or hides the heatmap; its opacity.
  const toggle = h("input", { type: "checkbox", name: "explain" });
  const opacity = h("input", {
    type: "range",
    name: "opacity",
    min: 0,
    max: 1,
    step: 0.05,
    value: 0.5,
  });
  const said = h("span.muted.explained", {});
  let canvas = null;
  const show = () => {
    if (canvas) {
      canvas.style.display = toggle.checked ? "block" : "none";
      canvas.style.opacity = opacity.value;
    }
  };
  toggle.addEventListener("change", async () => {
    if (canvas || !toggle.checked) return show();
    said.textContent = " explaining…";
    const form = new FormData();
    form.append("files", file, file.name);
    try {
      const answer = await api(`/explain${query({ model: ref })}`, { method: "POST", form });
      const [result] = answer.results;
      canvas = heatmapCanvas(result.upsampled);
      toggle.closest(".pred").querySelector(".picture").append(canvas);
      const { label, probability } = result.explained;
      said.textContent = ` explains ${label} (${(100 * probability).toFixed(1)}%) at ${answer.layer}`;
      said.dataset.label = label;
      show();
    } catch (error) {
      toggle.checked = false;
      said.textContent = ` ${error.message}`;
    }
  });
  opacity.addEventListener("input", show);
  const inline = "display:inline-flex;gap:0.3rem;align-items:center";
  return h(
    "div.explain-controls",
    { style: "display:flex;gap:0.75rem;align-items:center;flex-wrap:wrap" },
    h("label", { style: inline }, toggle, "Grad-CAM"),
    h("label", { style: inline }, "opacity", opacity),
    said,
  );
}

function heatmapCanvas(rows) {
  // The heatmap (0..1) colour-mapped with jet, as the API's PNG overlay is.
  const height = rows.length;
  const width = rows[0].length;
  const canvas = h("canvas.heatmap", {
    width,
    height,
    style:
      "position:absolute;left:0;top:0;width:96px;height:96px;object-fit:contain;" +
      "image-rendering:pixelated;pointer-events:none",
  });
  const context = canvas.getContext("2d");
  const pixels = context.createImageData(width, height);
  const channel = (v, centre) => Math.max(0, Math.min(1, 1.5 - Math.abs(4 * v - centre)));
  rows.flat().forEach((v, i) => {
    pixels.data.set([channel(v, 3) * 255, channel(v, 2) * 255, channel(v, 1) * 255, 255], 4 * i);
  });
  context.putImageData(pixels, 0, 0);
  return canvas;
}
