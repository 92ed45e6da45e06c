// Wires the three panels (talk, voices, status) to the page. State for tests and debugging is on
// window.xzConsole.
import { apiKey, setApiKey } from "./api.js";
import { Microphone, MIC_RATE, wavBlob } from "./mic.js";
import { describe, drawChart, fetchStatus } from "./status.js";
import { TalkSession } from "./talk.js";
import { addVoice, deleteVoice, listVoices, newPlayer, speak } from "./voices.js";

const $ = (id) => document.getElementById(id);
const state = { voice: { firstAudioMs: null, bytes: 0, done: false, error: null }, status: null };
window.xzConsole = state;

// --- API key -------------------------------------------------------------------------------------
function showKey() {
  $("key-state").textContent = apiKey() ? "key set (this tab only)" : "no key";
}
$("api-key").value = apiKey();
$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setApiKey($("api-key").value.trim());
  showKey();
  refreshVoices();
});
showKey();

// --- Talk ----------------------------------------------------------------------------------------
function log(kind, text) {
  const p = document.createElement("p");
  p.className = kind;
  p.textContent = (kind === "user" ? "🗣 " : kind === "bot" ? "🤖 " : "") + text;
  $("talk-log").append(p);
  $("talk-log").scrollTop = $("talk-log").scrollHeight;
}
const talk = new TalkSession({
  log,
  state: (text) => { $("talk-state").textContent = text; $("talk-state").className = `badge ${text}`; },
  emotion: (emoji, name) => { $("talk-emotion").textContent = emoji; $("talk-emotion").title = name; },
  counters: (s) => {
    $("talk-counters").textContent =
      `sent ${s.framesSent} frames · received ${s.framesReceived} · decoded ${s.framesDecoded}`;
  },
  changed: updateTalkButtons,
});
state.talk = talk;

function updateTalkButtons() {
  const on = talk.connected;
  $("talk-connect").disabled = on;
  $("talk-close").disabled = !on;
  $("talk-listen").disabled = !on || talk.listening;
  $("talk-stop").disabled = !on || !talk.listening;
  $("talk-abort").disabled = !on;
  $("talk-send").disabled = !on;
}

async function guarded(what, fn) {
  try {
    await fn();
  } catch (error) {
    log("sys", `${what}: ${error.message}`);
  }
  updateTalkButtons();
}

$("talk-connect").addEventListener("click", () =>
  guarded("connect", () => talk.connect($("device-token").value.trim())));
$("talk-listen").addEventListener("click", () =>
  guarded("microphone", () => talk.startListening($("talk-mode").value)));
$("talk-stop").addEventListener("click", () => talk.stopListening());
$("talk-abort").addEventListener("click", () => talk.abort());
$("talk-close").addEventListener("click", () => talk.close());
$("talk-text-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("talk-text").value.trim();
  if (!text) return;
  log("user", `${text} (typed)`);
  talk.sendText(text);
  $("talk-text").value = "";
});

// --- Voices --------------------------------------------------------------------------------------
const player = newPlayer();

async function refreshVoices() {
  try {
    const voices = await listVoices();
    const select = $("voice-select");
    const current = select.value;
    select.replaceChildren(...voices.data.map((v) => {
      const option = document.createElement("option");
      option.value = v.id;
      option.textContent = `${v.id}${v.default ? " (default)" : ""}${v.source === "preset" ? " · preset" : ""}`;
      return option;
    }));
    select.value = current || voices.default;
    $("voice-state").textContent = voices.supports_cloning ? "" : " · this backend cannot add voices";
  } catch (error) {
    $("voice-state").textContent = ` · ${error.message}`;
  }
}
$("voice-refresh").addEventListener("click", refreshVoices);

$("voice-speak-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  Object.assign(state.voice, { firstAudioMs: null, bytes: 0, done: false, error: null });
  $("voice-state").textContent = " · speaking…";
  try {
    await speak(player, $("voice-text").value, $("voice-select").value, (p) => {
      Object.assign(state.voice, p);
      $("voice-first-audio").textContent = p.firstAudioMs == null ? "–" : `${p.firstAudioMs.toFixed(0)} ms`;
      $("voice-bytes").textContent = `${p.bytes}`;
    });
    state.voice.done = true;
    $("voice-state").textContent = " · done";
  } catch (error) {
    state.voice.error = error.message;
    $("voice-state").textContent = ` · ${error.message}`;
  }
});

$("voice-delete").addEventListener("click", async () => {
  const name = $("voice-select").value;
  if (!name || !confirm(`Delete voice ${name}?`)) return;
  try {
    await deleteVoice(name);
    await refreshVoices();
  } catch (error) {
    $("voice-state").textContent = ` · ${error.message}`;
  }
});

let recording = null;
let recorded = null;
$("voice-record").addEventListener("click", async () => {
  if (recording) {
    await recording.mic.stop();
    recorded = new File([wavBlob(recording.blocks, MIC_RATE)], "recording.wav", { type: "audio/wav" });
    $("voice-record-state").textContent = `${(recording.blocks.length * 0.06).toFixed(1)} s recorded`;
    $("voice-record").textContent = "Record";
    recording = null;
    return;
  }
  const blocks = [];
  recording = { blocks, mic: new Microphone((block) => blocks.push(block)) };
  try {
    await recording.mic.start();
    $("voice-record").textContent = "Stop recording";
    $("voice-record-state").textContent = "recording…";
  } catch (error) {
    recording = null;
    $("voice-record-state").textContent = error.message;
  }
});

$("voice-add-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const file = $("voice-file").files[0] || recorded;
  if (!file) {
    $("voice-add-state").textContent = " choose or record a prompt first";
    return;
  }
  try {
    const voice = await addVoice({ name: $("voice-name").value, promptText: $("voice-prompt-text").value, file });
    $("voice-add-state").textContent = ` added ${voice.id || voice.name}`;
    await refreshVoices();
  } catch (error) {
    $("voice-add-state").textContent = ` ${error.message}`;
  }
});

// --- Status --------------------------------------------------------------------------------------
async function pollStatus() {
  try {
    const status = await fetchStatus();
    state.status = status;
    const d = describe(status);
    $("status-sessions").textContent = d.sessions;
    $("status-engine").textContent = d.engine;
    $("status-batch").textContent = d.batch;
    $("status-queue").textContent = d.queue;
    $("status-memory").textContent = d.memory;
    $("status-first-audio").textContent = d.firstAudio;
    drawChart($("status-chart"), status);
    $("status-error").textContent = "";
  } catch (error) {
    $("status-error").textContent = error.message;
  }
  setTimeout(pollStatus, 1000);
}

refreshVoices();
pollStatus();
updateTalkButtons();
