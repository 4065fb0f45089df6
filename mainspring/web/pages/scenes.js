// Scenes: each scene a run's agent rendered, in the 3D viewer beside its constraint report and the rendered
// preview; or a local .glb file (read in the browser, never uploaded).
import {get, raw} from "../api.js";
import {h, table} from "../dom.js";
import {showGlb, ViewerMissing} from "../viewer.js";

const SCENE_TOOLS = new Set(["scene_render", "scene_validate"]);

function parse(text) {
  try { return JSON.parse(text); } catch { return null; }
}

/** The .glb as bytes: the server converts the scene document. */
async function glbOf(scene) {
  return (await raw("/v1/scenes/gltf", {method: "POST", json: {scene}})).arrayBuffer();
}

async function imageUrl(path) {
  return URL.createObjectURL(await (await raw(path)).blob());
}

function viewerBox(label) {
  return h("div", {class: "viewer", "aria-busy": "true", "data-label": label}, h("p", {}, "Loading the 3D view…"));
}

async function mount(box, data, label, disposers) {
  try {
    const v = await showGlb(box, data, label);
    disposers.push(v.dispose);
    box.setAttribute("data-meshes", String(v.meshes));
  } catch (e) {
    box.replaceChildren(h("p", {class: e instanceof ViewerMissing ? "empty" : "error", role: "alert"}, e.message));
  } finally {
    box.setAttribute("aria-busy", "false");
  }
}

function report(result) {
  const r = parse(result?.content) || {};
  const checks = r.constraints?.results || [];
  return h("div", {class: "report"},
    h("p", {}, r.valid === false ? h("strong", {class: "error"}, "Not valid") : h("strong", {class: "ok"}, "Valid"),
      r.constraints ? ` — ${r.constraints.num_passed} of ${r.constraints.num_constraints} constraints pass` : ""),
    (r.violations || []).length ? h("ul", {}, r.violations.map(v => h("li", {}, h("code", {}, v.path), " ", v.message)))
      : null,
    checks.length ? table("Constraints", [
      {label: "Constraint", cell: c => c.label}, {label: "", cell: c => c.passed ? "pass" : "fail"},
      {label: "Measured", cell: c => c.value == null ? "—" : `${c.quantity} ${c.value} ${c.unit}`},
    ], checks) : null);
}

export async function render(main, runId) {
  const disposers = [];
  const stop = () => disposers.forEach(d => d());
  main.append(h("h2", {}, "Scenes"));
  const runField = h("input", {id: "scene-run", name: "run", value: runId || "", placeholder: "run_…"});
  const file = h("input", {id: "glb-file", type: "file", accept: ".glb,model/gltf-binary"});
  const local = viewerBox("Local file");
  local.hidden = true;
  main.append(h("form", {class: "filters", "aria-label": "Open scenes", onsubmit: e => {
    e.preventDefault();
    if (runField.value.trim()) location.hash = `#/scenes/${runField.value.trim()}`;
  }}, h("label", {for: "scene-run"}, "Run"), runField, h("button", {type: "submit"}, "Show its scenes"),
     h("label", {for: "glb-file"}, "or open a .glb"), file), local);
  file.addEventListener("change", async () => {
    if (!file.files.length) return;
    local.hidden = false;
    await mount(local, await file.files[0].arrayBuffer(), file.files[0].name, disposers);
  });
  if (!runId) return stop;

  const [steps, artifacts] = await Promise.all([get(`/v1/runs/${runId}/steps`), get(`/v1/runs/${runId}/artifacts`)]);
  const calls = steps.data.flatMap(s => s.tool_calls).filter(c => SCENE_TOOLS.has(c.name));
  const previews = artifacts.data.filter(a => a.mime === "image/png");
  if (!calls.length) {
    main.append(h("p", {class: "empty"}, "This run made no scene tool call."));
    return stop;
  }
  let preview = 0;
  for (const [n, call] of calls.entries()) {
    const args = parse(call.arguments) || {};
    const scene = typeof args.scene === "string" ? parse(args.scene) : args.scene;
    const label = `Scene ${n + 1} (${call.name})`;
    const box = viewerBox(label);
    const img = h("figure", {class: "preview"});
    main.append(h("section", {class: "scene", "aria-label": label}, h("h3", {}, label),
      h("div", {class: "scene-grid"}, box, h("div", {}, report(call.result), img))));
    const rendered = parse(call.result?.content)?.rendered && previews[preview++];
    if (rendered) {
      imageUrl(rendered.url).then(url => img.append(
        h("img", {src: url, alt: `Rendered preview of scene ${n + 1}`}), h("figcaption", {}, "Rendered preview")))
        .catch(e => img.append(h("p", {class: "error"}, `No preview: ${e.message}`)));
    }
    if (!scene || typeof scene !== "object") {
      box.replaceChildren(h("p", {class: "error"}, "The call's arguments hold no scene document."));
      continue;
    }
    glbOf(scene).then(data => mount(box, data, label, disposers))
      .catch(e => box.replaceChildren(h("p", {class: "error", role: "alert"}, e.message)));
  }
  return stop;
}
