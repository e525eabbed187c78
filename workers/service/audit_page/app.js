// The audit page: shows the next comparison, sends the vote, survives reloads and restarts.
// A vote being sent is kept in sessionStorage until the server has it (200, or 409
// "replayed": already in the log), so a reload or a server restart re-sends it with the same
// vote id and it is counted once.
"use strict";

const PENDING = "reval-audit-pending";
let current = null;
let busy = false;

function uid() {
  // crypto.randomUUID needs a secure context; a shared deployment may be plain http
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, b => b.toString(16).padStart(2, "0")).join("");
}

function voterId() {
  let id = localStorage.getItem("reval-audit-voter");
  if (!id) {
    id = "v-" + uid();
    localStorage.setItem("reval-audit-voter", id);
  }
  return id;
}

function show(text) {
  document.getElementById("message").textContent = text;
}

function showProgress(p) {
  document.getElementById("bar").max = p.total;
  document.getElementById("bar").value = p.votes;
  const ballots = p.ballots.map(b => `#${b.area}: ballot ${b.ballot}/${b.of}`).join(", ");
  document.getElementById("count").textContent = `${p.votes} of ${p.total} votes (${ballots})`;
  document.getElementById("count").dataset.votes = String(p.votes);
}

function card(el, pair) {
  el.replaceChildren();
  const tags = document.createElement("div");
  tags.className = "tags";
  tags.textContent = pair.hashtags.map(h => "#" + h).join("  \u2014  ");
  el.appendChild(tags);
  for (const h of pair.hashtags) {
    const examples = pair.examples[h] || [];
    if (!examples.length) continue;
    const list = document.createElement("ul");
    for (const text of examples) {
      const item = document.createElement("li");
      item.textContent = text;
      list.appendChild(item);
    }
    el.appendChild(list);
  }
}

async function call(url, options) {
  const response = await fetch(url, Object.assign({credentials: "same-origin"}, options || {}));
  const body = await response.json().catch(() => ({}));
  return {status: response.status, body};
}

async function next() {
  const {status, body} = await call("/api/next?voter=" + encodeURIComponent(voterId()));
  if (status !== 200) {
    show(body.detail || `the server answered ${status}`);
    return;
  }
  showProgress(body.progress);
  if (!body.comparison) {
    current = null;
    document.body.classList.add("done");
    document.getElementById("task").hidden = true;
    show("Thank you: every comparison of this audit has its vote.");
    return;
  }
  current = body;
  card(document.getElementById("left"), body.left);
  card(document.getElementById("right"), body.right);
  document.getElementById("task").hidden = false;
  document.body.dataset.comparison = `${body.area}/${body.comparison}`;
}

async function send(vote) {
  sessionStorage.setItem(PENDING, JSON.stringify(vote));
  for (;;) {
    let result;
    try {
      result = await call("/api/vote", {
        method: "POST",
        headers: {"Content-Type": "application/json"},
        body: JSON.stringify(vote),
      });
    } catch (err) {
      show("The server does not answer; your vote is kept and sent again...");
      await new Promise(resolve => setTimeout(resolve, 1000));
      continue;
    }
    if (result.status === 503) {
      show(result.body.detail + " Retrying...");
      await new Promise(resolve => setTimeout(resolve, 1000));
      continue;
    }
    sessionStorage.removeItem(PENDING);
    if (result.status === 200 || result.body.error === "replayed") {
      show("");
    } else {
      show(result.body.detail || `vote refused (${result.status})`);
    }
    return;
  }
}

async function choose(choice) {
  if (busy || !current) return;
  busy = true;
  try {
    await send({
      vote_id: uid(),
      area: current.area,
      comparison: current.comparison,
      choice,
      voter: voterId(),
    });
    await next();
  } finally {
    busy = false;
  }
}

document.addEventListener("keydown", event => {
  const keys = {ArrowLeft: "left", ArrowRight: "right", ArrowDown: "tie"};
  if (keys[event.key]) {
    event.preventDefault();
    choose(keys[event.key]);
  }
});

document.addEventListener("DOMContentLoaded", async () => {
  for (const id of ["left", "right", "tie"]) {
    const el = document.getElementById(id);
    el.addEventListener("click", () => choose(el.dataset.choice));
  }
  busy = true;
  try {
    const pending = sessionStorage.getItem(PENDING);
    if (pending) await send(JSON.parse(pending));
    await next();
  } finally {
    busy = false;
  }
});
