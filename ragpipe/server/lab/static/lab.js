// ragpipe lab: one small vendored script (no CDN; loaded from 'self' under the CSP). Every page but
// the review queue's signing works without it.
"use strict";

// The comparison's "only cases that changed" box hides per-case rows where every metric tied.
function onlyChanged() {
  const box = document.getElementById("only-changed");
  const table = document.getElementById("per-case");
  if (!box || !table) return;
  const apply = () => {
    for (const row of table.querySelectorAll("tr[data-row]")) {
      const changed = row.querySelector('[data-outcome="win"], [data-outcome="loss"]') !== null;
      row.hidden = box.checked && !changed;
    }
  };
  box.addEventListener("change", apply);
  apply();
}

// Keyboard shortcuts never fire while the reviewer types in a form field or holds a modifier.
function shortcut(handlers) {
  document.addEventListener("keydown", (event) => {
    const t = event.target;
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (t && (t.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(t.tagName))) return;
    const handler = handlers[event.key];
    if (handler) {
      event.preventDefault();
      handler();
    }
  });
}

const b64 = {
  decode: (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0)),
  encode: (bytes) => btoa(String.fromCharCode(...new Uint8Array(bytes))),
};

// The review queue: the approver's key is read from the file input into this closure only (never
// uploaded, never stored); the server proposes, this page signs, the server verifies and records.
// Moving through the queue swaps the queue in place (fetched like any page), so the key stays.
function review() {
  const status = document.getElementById("status");
  let key = null;
  const say = (text, bad) => { status.textContent = text; status.className = bad ? "status problem" : "status ok"; };
  const item = () => document.getElementById("review");

  const load = async (url) => {
    const response = await fetch(url, { credentials: "same-origin" });
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    for (const id of ["versions", "queue"]) {
      const now = document.getElementById(id);
      const next = fresh.getElementById(id);
      if (now && next) now.replaceWith(document.adoptNode(next));
    }
    history.replaceState(null, "", url);
    bind();
  };
  const go = (id) => () => { const link = document.getElementById(id); if (link) load(link.href); };

  document.getElementById("key-file").addEventListener("change", async (event) => {
    key = null;
    const file = event.target.files[0];
    if (!file) return;
    try {
      const pem = await file.text();
      const body = pem.replace(/-----(BEGIN|END) PRIVATE KEY-----/g, "").replace(/\s+/g, "");
      key = await crypto.subtle.importKey("pkcs8", b64.decode(body), { name: "Ed25519" }, false, ["sign"]);
      say(`key loaded from ${file.name} (kept in this page only)`);
    } catch (err) {
      say(`key_unreadable: ${file.name} is not an unencrypted PKCS#8 Ed25519 PEM key`, true);
    }
  });

  const post = async (url, body) => {
    const response = await fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ csrf: item().dataset.csrf, ...body }),
    });
    const data = await response.json();
    if (!response.ok) throw new Error(`${data.code}: ${data.message}`);
    return data;
  };

  const decide = async (decision, edited) => {
    const card = item();
    if (!card) return;
    if (!key) { say("no_key: load your approver key file first", true); return; }
    say(`signing: ${decision} of case ${card.dataset.case}`);
    try {
      const by = document.getElementById("by").value.trim();
      const proposed = await post(card.dataset.propose, { case_id: card.dataset.case, decision, by, edited });
      const signature = await crypto.subtle.sign({ name: "Ed25519" }, key, b64.decode(proposed.statement_b64));
      const done = await post(card.dataset.decide, { token: proposed.token, signature: `ed25519:${b64.encode(signature)}` });
      await load(`${card.dataset.here}?at=${card.dataset.at}`);  // the decided case left the queue
      say(`recorded: ${done.recorded.decision} of case ${done.recorded.case_id} (dataset record ${done.recorded.seq})`);
    } catch (err) {
      say(err.message, true);
    }
  };

  const openEdit = () => {
    const form = document.getElementById("edit-form");
    if (!form) return;
    form.hidden = false;
    document.getElementById("edit").setAttribute("aria-expanded", "true");
    document.getElementById("f-query").focus();
  };
  // (re)bind the controls of the queue section now in the page
  const bind = () => {
    for (const id of ["next", "prev"]) {
      const link = document.getElementById(id);
      if (link) link.addEventListener("click", (event) => { event.preventDefault(); load(link.href); });
    }
    if (!item()) return;
    document.getElementById("accept").addEventListener("click", () => decide("accept"));
    document.getElementById("reject").addEventListener("click", () => decide("reject"));
    document.getElementById("edit").addEventListener("click", openEdit);
    const form = document.getElementById("edit-form");
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const edited = {};
      for (const [name, value] of new FormData(form)) edited[name] = value;
      decide("edit", edited);
    });
  };
  bind();
  shortcut({ a: () => decide("accept"), e: openEdit, r: () => decide("reject"), j: go("next"), k: go("prev") });
}

// Pairwise review: 1, 2 and 0 press the matching button (the form posts with the CSRF token).
function pairwise() {
  if (!document.getElementById("pairwise-form")) return;
  const press = (id) => () => document.getElementById(id).click();
  shortcut({ 1: press("choose-a"), 2: press("choose-b"), 0: press("choose-tie") });
}

document.addEventListener("DOMContentLoaded", () => {
  onlyChanged();
  if (document.getElementById("key-file")) review();
  else if (document.getElementById("queue")) {
    const follow = (id) => () => { const link = document.getElementById(id); if (link) link.click(); };
    shortcut({ j: follow("next"), k: follow("prev") });
  }
  pairwise();
});
