// The 3D viewer: a .glb in three.js (vendored from npm into .cache/npm-web, served by the app), orbit controls
// by mouse, touch and arrow keys. Draws only when the view changes, so an idle page costs no CPU.

export class ViewerMissing extends Error {}

async function three() {
  try {
    const [THREE, {GLTFLoader}, {OrbitControls}] = await Promise.all([
      import("three"), import("three/addons/loaders/GLTFLoader.js"), import("three/addons/controls/OrbitControls.js")]);
    return {THREE, GLTFLoader, OrbitControls};
  } catch (e) {
    throw new ViewerMissing("The 3D viewer is not installed: three.js is vendored from npm at install time " +
                            "(make up; see docs/console.md).");
  }
}

/** Show the .glb `data` (an ArrayBuffer) in `container`; resolves to {dispose, meshes} once it is drawn. */
export async function showGlb(container, data, label) {
  const {THREE, GLTFLoader, OrbitControls} = await three();
  const gltf = await new Promise((resolve, reject) => new GLTFLoader().parse(data, "", resolve, reject));
  const renderer = new THREE.WebGLRenderer({antialias: true, preserveDrawingBuffer: true});
  renderer.setPixelRatio(Math.min(window.devicePixelRatio || 1, 2));
  const canvas = renderer.domElement;
  Object.assign(canvas, {tabIndex: 0});
  canvas.setAttribute("role", "img");
  canvas.setAttribute("aria-label", `${label}: drag or use the arrow keys to orbit, scroll to zoom`);
  container.replaceChildren(canvas);

  const scene = new THREE.Scene();
  scene.background = new THREE.Color(0xe9ecf1);
  scene.add(gltf.scene, new THREE.HemisphereLight(0xffffff, 0x444444, 1.5));
  const box = new THREE.Box3().setFromObject(gltf.scene);
  const size = box.getSize(new THREE.Vector3()).length() || 1;
  const centre = box.getCenter(new THREE.Vector3());
  const camera = new THREE.PerspectiveCamera(45, 4 / 3, size / 100, size * 100);
  const glbCamera = gltf.cameras?.[0];
  if (glbCamera) {  // the scene's own camera first: what the preview shows
    glbCamera.updateMatrixWorld();
    camera.position.setFromMatrixPosition(glbCamera.matrixWorld);
  } else {
    camera.position.copy(centre).add(new THREE.Vector3(size * 0.6, size * 0.5, size * 0.8));
  }
  const controls = new OrbitControls(camera, canvas);
  controls.target.copy(centre);
  controls.listenToKeyEvents(canvas);
  controls.update();

  const draw = () => renderer.render(scene, camera);
  const resize = () => {
    const w = container.clientWidth || 640, h = Math.round(w * 3 / 4);
    renderer.setSize(w, Math.min(h, 480), false);
    camera.aspect = w / Math.min(h, 480);
    camera.updateProjectionMatrix();
    draw();
  };
  controls.addEventListener("change", draw);
  const observer = new ResizeObserver(resize);
  observer.observe(container);
  resize();
  let meshes = 0;
  gltf.scene.traverse(o => { if (o.isMesh) meshes++; });
  return {meshes, dispose: () => { observer.disconnect(); controls.dispose(); renderer.dispose(); }};
}
