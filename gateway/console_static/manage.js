// The management panels (admin key: the API key above): devices (online, agent, firmware, last seen,
// kick, delete), activation (enter a device's code, choose its agent) and agents (create, edit, delete,
// try the voice). They call /v1/devices, /v1/activations, /v1/agents, /v1/voices and /v1/audio/speech.
// State for tests and debugging is on window.xzManage.
import { apiFetch } from "./api.js";
import { listVoices, newPlayer, speak } from "./voices.js";

const $ = (id) => document.getElementById(id);
const BUILTINS = ["end_conversation", "change_voice", "get_time"];
const state = { devices: [], agents: [], defaultAgent: null, current: null, voices: [], busy: 0,
                tried: null, errors: [] };
window.xzManage = state;

async function json(path, options = {}) {
  const init = { ...options };
  if (options.body !== undefined) {
    init.headers = { "Content-Type": "application/json" };
    init.body = JSON.stringify(options.body);
  }
  const response = await apiFetch(path, init);
  return response.status === 204 ? null : response.json();
}

// Runs `fn`, showing its error in the panel's error line (and counting it for tests).
async function guarded(errorId, fn) {
  state.busy += 1;
  $(errorId).textContent = "";
  try {
    return await fn();
  } catch (error) {
    $(errorId).textContent = error.message;
    state.errors.push(error.message);
    return undefined;
  } finally {
    state.busy -= 1;
  }
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  row.append(td);
  return td;
}

function when(seconds) {
  if (!seconds) return "–";
  const ago = Date.now() / 1000 - seconds;
  if (ago < 90) return `${Math.max(0, Math.round(ago))} s ago`;
  if (ago < 5400) return `${Math.round(ago / 60)} min ago`;
  return new Date(seconds * 1000).toLocaleString();
}

function agentOptions(select, chosen) {
  select.replaceChildren();
  for (const name of ["default", ...state.agents.map((a) => a.name)]) {
    const option = document.createElement("option");
    option.value = name;
    option.textContent = name;
    select.append(option);
  }
  select.value = chosen || "default";
}

// --- devices -------------------------------------------------------------------------------------
async function refreshDevices() {
  await guarded("devices-error", async () => {
    const page = await json("/v1/devices?limit=200");
    state.devices = page.data;
    const c = page.counts || {};
    $("devices-counts").textContent =
      `${Object.entries(c).map(([k, v]) => `${k}: ${v}`).join(" · ")} · activation: ${page.activation}`;
    const body = $("devices-table").querySelector("tbody");
    body.replaceChildren();
    for (const device of page.data) body.append(deviceRow(device));
  });
}

function deviceRow(device) {
  const row = document.createElement("tr");
  row.dataset.deviceId = device.device_id;
  cell(row, device.device_id, "device-id");
  cell(row, device.pending_code ? `${device.state} (code shown)` : device.state, "device-state");
  cell(row, device.online ? "online" : "offline", device.online ? "online" : "offline");
  const agentCell = cell(row, "", "device-agent");
  const select = document.createElement("select");
  agentOptions(select, device.agent);
  select.addEventListener("change", () => guarded("devices-error", async () => {
    await json(`/v1/devices/${encodeURIComponent(device.device_id)}`, { method: "PATCH",
                                                                       body: { agent: select.value } });
    await refreshDevices();
  }));
  agentCell.append(select);
  cell(row, `${device.board || "?"} / ${device.firmware || "?"}`);
  cell(row, when(device.last_seen));
  const latencies = device.latency_ms || [];
  cell(row, latencies.length ? `${Math.round(latencies[latencies.length - 1])} ms` : "–");
  const actions = cell(row, "");
  const kick = document.createElement("button");
  kick.textContent = "Kick";
  kick.className = "device-kick";
  kick.addEventListener("click", () => guarded("devices-error", async () => {
    await json(`/v1/devices/${encodeURIComponent(device.device_id)}/kick`, { method: "POST" });
    await refreshDevices();
  }));
  const remove = document.createElement("button");
  remove.textContent = "Delete";
  remove.className = "danger device-delete";
  remove.addEventListener("click", () => guarded("devices-error", async () => {
    if (!window.confirm(`Delete ${device.device_id}, its code and its memory?`)) return;
    await json(`/v1/devices/${encodeURIComponent(device.device_id)}`, { method: "DELETE" });
    await refreshDevices();
  }));
  actions.append(kick, " ", remove);
  return row;
}

// --- activation ----------------------------------------------------------------------------------
$("activation-form").addEventListener("submit", (event) => {
  event.preventDefault();
  $("activation-result").textContent = "";
  guarded("activation-error", async () => {
    const code = $("activation-code").value.replace(/\s+/g, "");
    const device = await json("/v1/activations", { method: "POST",
                                                   body: { code, agent: $("activation-agent").value } });
    $("activation-result").textContent = `bound ${device.device_id} to agent ${device.agent}`;
    $("activation-code").value = "";
    await refreshDevices();
  });
});

// --- agents --------------------------------------------------------------------------------------
async function refreshAgents(select) {
  await guarded("agents-error", async () => {
    const page = await json("/v1/agents");
    state.defaultAgent = page.default;
    state.agents = page.data;
    const names = ["default", ...page.data.map((a) => a.name)];
    const chosen = select || $("agent-select").value || "default";
    agentOptions($("agent-select"), names.includes(chosen) ? chosen : "default");
    agentOptions($("activation-agent"), $("activation-agent").value);
    showAgent();
  });
}

async function refreshVoices() {
  await guarded("agents-error", async () => {
    const voices = await listVoices();
    state.voices = voices.data.map((v) => v.id);
    const select = $("agent-voice");
    const chosen = select.value;
    select.replaceChildren();
    for (const name of ["", ...state.voices]) {
      const option = document.createElement("option");
      option.value = name;
      option.textContent = name || "(engine's default)";
      select.append(option);
    }
    select.value = chosen;
  });
}

function builtinBoxes() {
  const span = $("agent-builtins");
  span.replaceChildren();
  for (const name of BUILTINS) {
    const label = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.value = name;
    box.className = "agent-builtin";
    label.append(box, ` ${name} `);
    span.append(label);
  }
}

function selectedAgent() {
  const name = $("agent-select").value;
  if (name === "default") return state.defaultAgent;
  return state.agents.find((a) => a.name === name) || null;
}

// Fills the form from an agent (the default agent is shown read-only: it is config.yaml's).
function showAgent(agent = selectedAgent()) {
  state.current = agent;
  if (!agent) return;
  const readOnly = !!agent.read_only;
  $("agent-name").value = agent.name;
  $("agent-name").disabled = agent.version > 0 || readOnly;
  $("agent-description").value = agent.description || "";
  $("agent-version").textContent = readOnly ? "from config.yaml (read only)"
    : agent.version ? `version ${agent.version}` : "new";
  $("agent-role").value = agent.role_prompt || "";
  $("agent-greeting").value = agent.greeting || "";
  $("agent-voice").value = agent.voice || "";
  $("agent-speed").value = agent.speed;
  $("agent-instruct").value = agent.instruct || "";
  $("agent-language").value = agent.language || "";
  $("agent-provider").value = agent.llm.provider;
  $("agent-base-url").value = agent.llm.base_url;
  $("agent-model").value = agent.llm.model;
  $("agent-key").value = agent.llm.api_key;
  $("agent-temperature").value = agent.llm.temperature ?? "";
  $("agent-tool-device").checked = agent.tools.device;
  for (const box of document.querySelectorAll(".agent-builtin")) box.checked = agent.tools.builtins.includes(box.value);
  $("agent-mcp").value = agent.tools.mcp_servers === null ? "" : agent.tools.mcp_servers.join(", ");
  $("agent-memory").checked = agent.memory;
  $("agent-summary").value = agent.memory_summary_chars;
  $("agent-idle").value = agent.idle_no_voice_s;
  $("agent-idle-hard").value = agent.idle_hard_s;
  $("agent-expressive").checked = agent.expressive;
  $("agent-vision").value = agent.vision_model || "";
  $("agent-save").disabled = readOnly;
  $("agent-delete").disabled = readOnly || !agent.version;
}

function formAgent() {
  const temperature = $("agent-temperature").value.trim();
  const servers = $("agent-mcp").value.split(",").map((s) => s.trim()).filter(Boolean);
  return {
    name: $("agent-name").value.trim(),
    description: $("agent-description").value,
    role_prompt: $("agent-role").value,
    greeting: $("agent-greeting").value,
    voice: $("agent-voice").value,
    speed: Number($("agent-speed").value),
    instruct: $("agent-instruct").value,
    language: $("agent-language").value,
    llm: { provider: $("agent-provider").value, base_url: $("agent-base-url").value.trim(),
           model: $("agent-model").value.trim(), api_key: $("agent-key").value.trim(),
           temperature: temperature === "" ? null : Number(temperature) },
    tools: { device: $("agent-tool-device").checked,
             builtins: [...document.querySelectorAll(".agent-builtin")].filter((b) => b.checked).map((b) => b.value),
             mcp_servers: servers.length ? servers : null },
    memory: $("agent-memory").checked,
    memory_summary_chars: Number($("agent-summary").value),
    idle_no_voice_s: Number($("agent-idle").value),
    idle_hard_s: Number($("agent-idle-hard").value),
    expressive: $("agent-expressive").checked,
    vision_model: $("agent-vision").value.trim(),
  };
}

$("agent-select").addEventListener("change", () => showAgent());
$("agent-new").addEventListener("click", () => {
  const base = state.defaultAgent ? structuredClone(state.defaultAgent) : null;
  if (!base) return;
  Object.assign(base, { name: "", description: "", version: 0, read_only: false });
  base.llm.api_key = "config";
  showAgent(base);
  $("agent-name").focus();
});
$("agent-form").addEventListener("submit", (event) => {
  event.preventDefault();
  $("agent-state").textContent = "";
  guarded("agents-error", async () => {
    const current = state.current;
    const fields = formAgent();
    let saved;
    if (current && current.version > 0) {
      saved = await json(`/v1/agents/${encodeURIComponent(current.name)}`, { method: "PATCH",
                         body: { ...fields, version: current.version } });
    } else {
      saved = await json("/v1/agents", { method: "POST", body: fields });
    }
    $("agent-state").textContent = `saved ${saved.name} (version ${saved.version})`;
    await refreshAgents(saved.name);
    await refreshDevices();
  });
});
$("agent-delete").addEventListener("click", () => guarded("agents-error", async () => {
  const current = state.current;
  if (!current || !current.version) return;
  if (!window.confirm(`Delete agent ${current.name}? Its devices talk with the default agent.`)) return;
  await json(`/v1/agents/${encodeURIComponent(current.name)}`, { method: "DELETE" });
  $("agent-state").textContent = `deleted ${current.name}`;
  await refreshAgents("default");
  await refreshDevices();
}));

let player = null;
$("agent-try-form").addEventListener("submit", (event) => {
  event.preventDefault();
  state.tried = null;
  $("agent-try-state").textContent = "…";
  guarded("agents-error", async () => {
    player = player || newPlayer();
    const fields = formAgent();
    const options = { speed: fields.speed, instruct: fields.instruct || undefined };
    const progress = await speak(player, $("agent-try-text").value, fields.voice, (p) => {
      $("agent-try-state").textContent = `${p.bytes} bytes, first audio ${Math.round(p.firstAudioMs ?? 0)} ms`;
    }, options);
    state.tried = { voice: fields.voice, bytes: progress.bytes };
  });
});

async function refreshAll() {
  await refreshVoices();
  await refreshAgents();
  await refreshDevices();
}

builtinBoxes();
$("devices-refresh").addEventListener("click", () => refreshAll());
$("key-form").addEventListener("submit", () => refreshAll()); // main.js stores the key first
state.ready = refreshAll();
