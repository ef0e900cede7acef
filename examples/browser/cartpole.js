// gymnasium's CartPole-v1 in JavaScript, acting locally with onnxruntime-web and
// training against tether serve over RLlink on a websocket. Progress is in
// window.cartpole (read by tests/integration/test_browser_cartpole.py).
"use strict";

const status = window.cartpole = {episodes: 0, meanReturn100: 0, envSteps: 0, envStepsSent: 0, version: null,
                                  state: "starting", error: null};

class CartPole {
  constructor() { this.reset(); }
  reset() {
    this.s = [0, 0, 0, 0].map(() => Math.random() * 0.1 - 0.05);
    this.steps = 0;
    return this.s.slice();
  }
  step(action) {
    const [gravity, massCart, massPole, length, forceMag, tau] = [9.8, 1.0, 0.1, 0.5, 10.0, 0.02];
    const total = massCart + massPole, pml = massPole * length;
    let [x, xDot, theta, thetaDot] = this.s;
    const force = action === 1 ? forceMag : -forceMag;
    const cos = Math.cos(theta), sin = Math.sin(theta);
    const temp = (force + pml * thetaDot * thetaDot * sin) / total;
    const thetaAcc = (gravity * sin - cos * temp) / (length * (4 / 3 - massPole * cos * cos / total));
    const xAcc = temp - pml * thetaAcc * cos / total;
    x += tau * xDot; xDot += tau * xAcc; theta += tau * thetaDot; thetaDot += tau * thetaAcc;
    this.s = [x, xDot, theta, thetaDot];
    this.steps += 1;
    const terminated = x < -2.4 || x > 2.4 || theta < -12 * 2 * Math.PI / 360 || theta > 12 * 2 * Math.PI / 360;
    const truncated = !terminated && this.steps >= 500;
    return {obs: this.s.slice(), reward: 1, terminated, truncated};
  }
}

function draw(s) {
  const c = document.getElementById("view").getContext("2d");
  c.clearRect(0, 0, 600, 200);
  const x = 300 + s[0] * 100;
  c.fillRect(x - 25, 150, 50, 20);
  c.beginPath(); c.moveTo(x, 150); c.lineTo(x + 100 * Math.sin(s[2]), 150 - 100 * Math.cos(s[2])); c.stroke();
}

async function main() {
  const url = new URLSearchParams(location.search).get("ws") || "ws://127.0.0.1:8765/rllink";
  ort.env.wasm.numThreads = 1;
  ort.env.wasm.wasmPaths = new URL("vendor/", location.href).href;
  const link = await RLlinkSocket.open(url);
  await link.request({type: "PING", protocol_version: "1.3", client_name: "browser-cartpole"});
  const config = await link.request({type: "GET_CONFIG"});
  const inputName = (config.onnx_input_names || ["obs"])[0];
  const outputName = (config.onnx_output_names || ["action_dist_inputs"])[0];
  const perSample = config.env_steps_per_sample || 500;
  let state = await link.request({type: "GET_STATE"});
  let session = await ort.InferenceSession.create(await decodeOnnx(state.onnx_file), {executionProviders: ["wasm"]});
  let version = status.version = state.weights_seq_no;
  const clientSession = crypto.randomUUID().replace(/-/g, "");
  let batchSeq = 0;
  const env = new CartPole();
  const returns = [];
  let obs = env.reset(), episodeReturn = 0, episodeId = crypto.randomUUID();
  let chunk = {obs: [obs], actions: [], rewards: [], action_logp: []};
  let batch = [], batchSteps = 0;
  status.state = "training";
  while (true) {
    const input = new ort.Tensor("float32", Float32Array.from(obs), [1, 4]);
    const logits = (await session.run({[inputName]: input}))[outputName].data;
    const m = Math.max(logits[0], logits[1]);
    const p1 = Math.exp(logits[1] - m) / (Math.exp(logits[0] - m) + Math.exp(logits[1] - m));
    const action = Math.random() < p1 ? 1 : 0;
    const logp = Math.log(action === 1 ? p1 : 1 - p1);
    const result = env.step(action);
    chunk.actions.push(action);
    chunk.rewards.push(result.reward);
    chunk.action_logp.push(logp);
    chunk.obs.push(result.obs);
    episodeReturn += result.reward;
    status.envSteps += 1;
    batchSteps += 1;
    obs = result.obs;
    if (result.terminated || result.truncated) {
      batch.push({...chunk, is_terminated: result.terminated, is_truncated: result.truncated, episode_id: episodeId});
      returns.push(episodeReturn);
      if (returns.length > 100) returns.shift();
      status.episodes += 1;
      status.meanReturn100 = returns.reduce((a, b) => a + b, 0) / returns.length;
      obs = env.reset(); episodeReturn = 0; episodeId = crypto.randomUUID();
      chunk = {obs: [obs], actions: [], rewards: [], action_logp: []};
      draw(obs);
    }
    if (batchSteps >= perSample) {
      // The ongoing episode's steps so far go too: its current observation closes them (§10.4).
      if (chunk.actions.length > 0) {
        batch.push({...chunk, is_terminated: false, is_truncated: false, episode_id: episodeId});
        chunk = {obs: [obs], actions: [], rewards: [], action_logp: []};
      }
      batchSeq += 1;
      // Strict on-policy: wait for the weights that answer this batch.
      const answer = await link.request({type: "EPISODES_AND_GET_STATE", episodes: batch, env_steps: batchSteps,
                                         agent_steps: batchSteps, weights_seq_no: version,
                                         client_session: clientSession, batch_seq: batchSeq});
      status.envStepsSent += batchSteps;
      batch = []; batchSteps = 0;
      if (answer.onnx_file) session = await ort.InferenceSession.create(await decodeOnnx(answer.onnx_file),
                                                                        {executionProviders: ["wasm"]});
      version = status.version = answer.weights_seq_no;
      document.getElementById("status").textContent = JSON.stringify(status, null, 1);
    }
  }
}

main().catch(error => {
  // TRAINING_DONE: the run reached its end and said so (§6.6); a bare close: the server went away.
  status.state = error.code === "TRAINING_DONE" ? "training_done" : error.code === "CLOSED" ? "server_gone" : "failed";
  if (error.summary) status.summary = error.summary;
  status.error = String(error && error.message || error);
  document.getElementById("status").textContent = JSON.stringify(status, null, 1);
});
