// Scenes: a placeholder until the viewer lands (see docs/console.md).
import {h} from "../dom.js";

export async function render(main) {
  main.append(h("h2", {}, "Scenes"), h("p", {}, "The 3D scene viewer is not part of this console yet."));
}
