// pglockui: live data (the page fetches its own URL every second and swaps in #live
// and #health), countdowns, the prefix filter and the confirmation of the actions.
// No text from the server is ever inserted as HTML except the server's own escaped
// page, parsed by DOMParser; messages go through textContent.
"use strict";
(function () {
  const POLL_MS = 1000;
  let skew = 0; // the store's clock less ours, from the locks table's data-now
  let timer = null;
  let inflight = null;

  function readSkew(root) {
    const t = root.querySelector("[data-now]");
    if (t) skew = Date.parse(t.dataset.now) - Date.now();
  }

  function human(ms) {
    const neg = ms < 0;
    let d = Math.abs(ms), s;
    if (d >= 86400000) s = Math.floor(d / 86400000) + "d" + String(Math.floor(d % 86400000 / 3600000)).padStart(2, "0") + "h";
    else if (d >= 3600000) s = Math.floor(d / 3600000) + "h" + String(Math.floor(d % 3600000 / 60000)).padStart(2, "0") + "m";
    else if (d >= 60000) s = Math.floor(d / 60000) + "m" + String(Math.floor(d % 60000 / 1000)).padStart(2, "0") + "s";
    else if (d >= 10000) s = Math.floor(d / 1000) + "s";
    else if (d >= 1000) s = (Math.floor(d / 100) / 10).toFixed(1) + "s";
    else s = Math.floor(d) + "ms";
    return neg ? "-" + s : s;
  }

  // tick moves every countdown of a held row, and turns a row expiring under a third
  // of its ttl, or free at its end, before the next poll says so.
  function tick() {
    const now = Date.now() + skew;
    for (const td of document.querySelectorAll("td.countdown[data-expires-at]")) {
      const tr = td.closest("tr");
      if (!tr || !(tr.classList.contains("held") || tr.classList.contains("expiring"))) continue;
      const left = Date.parse(td.dataset.expiresAt) - now;
      if (left <= 0) {
        td.textContent = "expired";
        tr.classList.remove("held", "expiring");
        tr.classList.add("free");
        continue;
      }
      td.textContent = human(left);
      const ttl = Number(td.dataset.ttlMs || 0);
      if (ttl > 0 && left < ttl / 3 && tr.classList.contains("held")) {
        tr.classList.replace("held", "expiring");
      }
    }
  }

  // focusKey names the focused element inside #live so that it can be focused again
  // in the swapped-in copy.
  function focusKey(el) {
    if (!el || !document.getElementById("live").contains(el)) return null;
    return [el.tagName, el.className, el.dataset.key || "", el.dataset.permit || "", el.getAttribute("value") || "", el.getAttribute("href") || ""].join("\u0000");
  }

  function refocus(key) {
    if (!key) return;
    for (const el of document.querySelectorAll("#live button, #live a, #live input")) {
      if (focusKey(el) === key) { el.focus(); return; }
    }
  }

  function banner(text) {
    const live = document.getElementById("live");
    let div = document.getElementById("error");
    if (!div) {
      div = document.createElement("div");
      div.id = "error";
      div.setAttribute("role", "alert");
      live.prepend(div);
    }
    div.textContent = text;
  }

  async function poll() {
    timer = null;
    const dialog = document.getElementById("confirm");
    if (document.hidden || (dialog && dialog.open)) { schedule(); return; }
    const ctl = new AbortController();
    inflight = ctl;
    const abort = setTimeout(() => ctl.abort(), 5000);
    try {
      const res = await fetch(location.href, { headers: { "Accept": "text/html" }, cache: "no-store", signal: ctl.signal });
      const doc = new DOMParser().parseFromString(await res.text(), "text/html");
      const fresh = doc.getElementById("live");
      if (!fresh) throw new Error("the console answered " + res.status + " " + res.statusText);
      const key = focusKey(document.activeElement);
      document.getElementById("live").replaceWith(fresh);
      const health = doc.getElementById("health");
      if (health) document.getElementById("health").replaceWith(health);
      readSkew(document);
      tick();
      refocus(key);
      document.dispatchEvent(new CustomEvent("pglockui:updated"));
    } catch (e) {
      if (inflight === ctl) banner("The console does not answer: " + (e && e.message ? e.message : e));
    } finally {
      clearTimeout(abort);
      if (inflight === ctl) inflight = null;
      schedule();
    }
  }

  function schedule() {
    if (timer === null) timer = setTimeout(poll, POLL_MS);
  }

  // Typing in the prefix filter narrows the table without a reload.
  function watchFilter() {
    const input = document.getElementById("prefix");
    if (!input) return;
    let wait = null;
    input.addEventListener("input", () => {
      clearTimeout(wait);
      wait = setTimeout(() => {
        const u = new URL(location.href);
        if (input.value) u.searchParams.set("prefix", input.value); else u.searchParams.delete("prefix");
        u.searchParams.delete("page");
        history.replaceState(null, "", u);
        if (inflight) inflight.abort();
        clearTimeout(timer);
        timer = null;
        poll();
      }, 250);
    });
  }

  function flash(text, ok) {
    const p = document.getElementById("flash");
    if (!p) return;
    p.textContent = text;
    p.className = ok ? "ok" : "failed";
    p.hidden = false;
  }

  // The actions: a click opens the confirmation; its Yes posts the form with fetch
  // and shows the answer.
  function watchActions() {
    const dialog = document.getElementById("confirm");
    if (!dialog) return;
    const form = document.getElementById("confirm-form");
    const text = document.getElementById("confirm-text");
    const key = document.getElementById("confirm-key");
    const permit = document.getElementById("confirm-permit");
    const olderThan = document.getElementById("confirm-older-than");
    const base = new URL(document.querySelector("nav a.brand").href);

    document.addEventListener("click", (e) => {
      const b = e.target.closest("button.force-release");
      if (!b) return;
      e.preventDefault();
      const what = b.dataset.permit ? "permit " + b.dataset.permit + " of " + b.dataset.key : b.dataset.key;
      text.textContent = "Force-release " + what + "? Its holder on " + (b.dataset.instance || "?") +
        " (token " + b.dataset.token + ") loses it at its next renewal, and its work is cancelled.";
      key.value = b.dataset.key;
      key.disabled = false;
      permit.value = b.dataset.permit || "";
      permit.disabled = !b.dataset.permit;
      olderThan.disabled = true;
      form.action = new URL("locks/release", base).href;
      dialog.showModal();
    });
    const prune = document.getElementById("prune");
    if (prune) {
      prune.addEventListener("submit", (e) => {
        e.preventDefault();
        const v = prune.elements["older_than"].value;
        text.textContent = "Prune every lock whose lease ended more than " + v + " ago? Live locks are never pruned.";
        olderThan.value = v;
        olderThan.disabled = false;
        key.disabled = true;
        permit.disabled = true;
        form.action = new URL("prune", base).href;
        dialog.showModal();
      });
    }
    document.getElementById("confirm-no").addEventListener("click", () => dialog.close());
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      dialog.close();
      try {
        const res = await fetch(form.action, { method: "POST", body: new URLSearchParams(new FormData(form)) });
        flash((await res.text()).trim(), res.ok);
      } catch (err) {
        flash("The console does not answer: " + err.message, false);
      }
      clearTimeout(timer);
      timer = null;
      poll();
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    readSkew(document);
    tick();
    setInterval(tick, 1000);
    watchFilter();
    watchActions();
    schedule();
  });
})();
