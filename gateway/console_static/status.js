// The status panel: polls GET /v1/status and draws the recent first-audio latencies on a canvas.
import { apiFetch } from "./api.js";

export const WINDOW_S = 300;

export async function fetchStatus() {
  const response = await apiFetch(`/v1/status?window_s=${WINDOW_S}`);
  return response.json();
}

function gib(bytes) {
  return bytes == null ? "?" : `${(bytes / 2 ** 30).toFixed(2)} GiB`;
}

export function describe(status) {
  const e = status.engine;
  const m = status.memory || {};
  const used = m.cuda ? `GPU ${gib(m.cuda.allocated_bytes)} allocated, ${gib(m.cuda.reserved_bytes)} reserved`
                      : `RSS ${gib(m.process_rss_bytes)}`;
  const fa = status.first_audio;
  return {
    sessions: `${status.sessions.active}` +
      (status.sessions.devices.length ? ` (${status.sessions.devices.map((d) => d.id).join(", ")})` : ""),
    engine: `${e.backend} · ${e.state} · ${e.live_requests} live · ${e.requests_total} requests`,
    batch: `${e.last_batch_size ?? "–"} / ${e.mean_batch_size != null ? Number(e.mean_batch_size).toFixed(2) : "–"}` +
      ` / ${e.max_batch_size ?? "–"}`,
    queue: `${e.queue_depth} (max pending ${e.max_pending_requests})`,
    memory: `budget ${m.budget_gib ? m.budget_gib + " GiB" : "none"}; ${used}`,
    firstAudio: fa.count ? `${fa.count} turns, median ${(fa.median_s * 1000).toFixed(0)} ms, ` +
      `max ${(fa.max_s * 1000).toFixed(0)} ms` : "no turns yet",
  };
}

// Latency (y, seconds) over the last WINDOW_S seconds (x), drawn by hand: points and a line.
export function drawChart(canvas, status) {
  const ctx = canvas.getContext("2d");
  const { width: w, height: h } = canvas;
  const pad = { l: 44, r: 8, t: 10, b: 20 };
  ctx.clearRect(0, 0, w, h);
  ctx.font = "11px system-ui, sans-serif";
  const points = status.first_audio.recent;
  const top = Math.max(0.5, ...points.map((p) => p[1])) * 1.15;
  const x = (t) => pad.l + ((t - (status.time - WINDOW_S)) / WINDOW_S) * (w - pad.l - pad.r);
  const y = (s) => h - pad.b - (s / top) * (h - pad.t - pad.b);
  ctx.strokeStyle = "#e5e7eb";
  ctx.fillStyle = "#6b7280";
  for (let i = 0; i <= 4; i++) {
    const s = (top * i) / 4;
    ctx.beginPath(); ctx.moveTo(pad.l, y(s)); ctx.lineTo(w - pad.r, y(s)); ctx.stroke();
    ctx.fillText(`${(s * 1000).toFixed(0)} ms`, 2, y(s) + 4);
  }
  ctx.fillText(`-${WINDOW_S / 60} min`, pad.l, h - 5);
  ctx.fillText("now", w - pad.r - 22, h - 5);
  ctx.strokeStyle = "#2563eb";
  ctx.fillStyle = "#2563eb";
  ctx.beginPath();
  points.forEach(([t, s], i) => (i ? ctx.lineTo(x(t), y(s)) : ctx.moveTo(x(t), y(s))));
  ctx.stroke();
  for (const [t, s] of points) {
    ctx.beginPath(); ctx.arc(x(t), y(s), 3, 0, 2 * Math.PI); ctx.fill();
  }
}
