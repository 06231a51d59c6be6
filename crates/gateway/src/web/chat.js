"use strict";
// A plain WebSocket client of the gateway protocol: req/res frames with ids, and events.
const $ = (id) => document.getElementById(id);
const log = $("log"), statusEl = $("status");
let ws = null, nextId = 1;
const pending = new Map();   // request id -> {resolve, reject, onFinal}
const runs = new Map();      // runId -> {bubble, tools: Map, statusEl}

function setStatus(text, isError) {
  statusEl.textContent = text;
  statusEl.className = isError ? "error" : "";
}

function add(cls, text) {
  const el = document.createElement("div");
  el.className = cls;
  el.textContent = text;
  log.appendChild(el);
  log.scrollTop = log.scrollHeight;
  return el;
}

function request(method, params, onFinal) {
  return new Promise((resolve, reject) => {
    if (!ws || ws.readyState !== WebSocket.OPEN) return reject(new Error("not connected"));
    const id = String(nextId++);
    pending.set(id, { resolve, reject, onFinal });
    ws.send(JSON.stringify({ type: "req", id, method, params }));
  });
}

function onResponse(frame) {
  const p = pending.get(frame.id);
  if (!p) return;
  if (!frame.ok) {
    pending.delete(frame.id);
    p.reject(new Error(frame.error.code + ": " + frame.error.message));
    return;
  }
  // `agent` answers twice with the same id: accepted, then the end of the run.
  if (frame.payload && frame.payload.status === "accepted" && p.onFinal) {
    p.resolve(frame.payload);
    return;
  }
  pending.delete(frame.id);
  if (p.onFinal) p.onFinal(frame.payload); else p.resolve(frame.payload);
}

function runView(runId) {
  let view = runs.get(runId);
  if (!view) {
    view = { bubble: null, tools: new Map(), statusEl: add("run-status", "run " + runId.slice(0, 8) + ": accepted") };
    view.statusEl.dataset.run = runId;
    runs.set(runId, view);
  }
  return view;
}

function onAgentEvent(ev) {
  const view = runView(ev.runId);
  if (ev.stream === "lifecycle") {
    const reason = ev.data && ev.data.reason ? " (" + ev.data.reason + ")" : "";
    view.statusEl.textContent = "run " + ev.runId.slice(0, 8) + ": " + (ev.phase === "start" ? "running" : ev.phase + reason);
  } else if (ev.stream === "assistant" && ev.phase === "delta") {
    if (!view.bubble) view.bubble = add("msg assistant", "");
    view.bubble.textContent += ev.delta;
    log.scrollTop = log.scrollHeight;
  } else if (ev.stream === "tool") {
    const key = ev.toolCallId || ev.toolName;
    let el = view.tools.get(key);
    if (!el) {
      el = add("tool", "");
      el.dataset.tool = ev.toolName || "";
      view.tools.set(key, el);
      view.bubble = null; // text after a tool call goes into a new bubble
    }
    const ended = ev.phase === "result" || ev.phase === "end" || ev.phase === "error";
    el.textContent = "tool " + (ev.toolName || "tool") + " — " + (ended ? "done" : ev.phase);
    el.classList.toggle("done", ended);
  }
}

// The inbox: every conversation on every channel, newest first (admins only).
const conversations = new Map(); // sessionKey -> <li>
function onInboxEvent(ev) {
  let item = conversations.get(ev.sessionKey);
  if (!item) {
    item = document.createElement("li");
    item.dataset.session = ev.sessionKey;
    item.dataset.channel = ev.channel;
    const channel = document.createElement("span");
    channel.className = "channel";
    channel.textContent = ev.channel;
    const key = document.createElement("span");
    key.className = "key";
    key.textContent = ev.sessionKey;
    const last = document.createElement("span");
    last.className = "last";
    item.append(channel, key, last);
    item.addEventListener("click", () => {
      $("session").value = ev.sessionKey;
      loadHistory().catch((e) => setStatus(e.message, true));
    });
    conversations.set(ev.sessionKey, item);
  }
  item.dataset.direction = ev.direction;
  item.querySelector(".last").textContent = (ev.direction === "in" ? "← " : "→ ") + ev.text;
  $("conversations").prepend(item);
}

async function subscribeInbox() {
  try {
    await request("inbox.subscribe", {});
    $("inbox").hidden = false;
  } catch (e) {
    // Not an admin: no inbox, the chat works as before.
    $("inbox").hidden = true;
  }
}

function connect() {
  if (ws) ws.close();
  const proto = location.protocol === "https:" ? "wss://" : "ws://";
  ws = new WebSocket(proto + location.host + "/ws");
  setStatus("connecting…");
  ws.onopen = async () => {
    try {
      const token = $("token").value || localStorage.getItem("agentloop.token") || undefined;
      await request("connect", { client: { id: "webchat", version: "1" }, auth: { token } });
      if ($("token").value) localStorage.setItem("agentloop.token", $("token").value);
      setStatus("connected");
      document.body.dataset.connected = "true";
      await loadSessions();
      await loadHistory();
      await subscribeInbox();
    } catch (e) { setStatus(e.message, true); }
  };
  ws.onmessage = (m) => {
    const frame = JSON.parse(m.data);
    if (frame.type === "res") onResponse(frame);
    else if (frame.type === "event" && frame.event === "agent") onAgentEvent(frame.payload);
    else if (frame.type === "event" && frame.event === "inbox") onInboxEvent(frame.payload);
  };
  ws.onclose = (e) => {
    document.body.dataset.connected = "false";
    setStatus("disconnected" + (e.reason ? ": " + e.reason : ""), !!e.reason);
    for (const p of pending.values()) p.reject(new Error("connection closed"));
    pending.clear();
  };
}

async function loadSessions() {
  const { sessions } = await request("sessions.list", { limit: 50 });
  $("sessions").replaceChildren(...sessions.map((s) => { const o = document.createElement("option"); o.value = s.key; return o; }));
}

async function loadHistory() {
  log.replaceChildren();
  runs.clear();
  // A session that does not exist yet (its first message creates it) has no history.
  const { messages } = await request("chat.history", { sessionKey: $("session").value })
    .catch((e) => { if (e.message.startsWith("NOT_FOUND")) return { messages: [] }; throw e; });
  for (const m of messages) {
    if (m.role === "user" || m.role === "assistant") add("msg " + m.role, m.content);
  }
}

async function send(text) {
  add("msg user", text);
  try {
    const accepted = await request("agent", {
      message: text,
      sessionKey: $("session").value,
      idempotencyKey: (crypto.randomUUID ? crypto.randomUUID() : String(Date.now()) + Math.random()),
    }, (end) => {
      const view = runView(end.runId);
      if (!view.bubble && end.text) view.bubble = add("msg assistant", end.text);
      view.statusEl.textContent = "run " + end.runId.slice(0, 8) + ": " + end.status + (end.error ? " — " + end.error : "");
      view.statusEl.dataset.status = end.status;
    });
    runView(accepted.runId);
  } catch (e) { add("run-status error", e.message); }
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("input").value.trim();
  if (!text) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); }
});
$("session").addEventListener("change", () => loadHistory().catch((e) => setStatus(e.message, true)));
$("reconnect").addEventListener("click", connect);
connect();
