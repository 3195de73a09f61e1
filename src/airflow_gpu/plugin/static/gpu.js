// Refreshes the page's <main> from the same URL with ?fragment=1 every few seconds, and
// opens Airflow links (data-top) in the Airflow UI around this frame rather than inside it.
(function () {
  "use strict";
  const main = document.getElementById("main");
  const banner = document.getElementById("error");
  const state = document.getElementById("refresh-state");
  const every = Number(document.body.dataset.refresh || 5) * 1000;

  function fragmentUrl() {
    const url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    return url;
  }

  async function refresh() {
    if (document.hidden) return;
    try {
      const r = await fetch(fragmentUrl(), {credentials: "same-origin",
                                            headers: {Accept: "text/html"}});
      const text = await r.text();
      if (r.status === 401 || r.status === 403) {
        banner.textContent = "Your Airflow login has expired: reload the page to log in again.";
        banner.hidden = false;
        state.classList.add("stale");
        return;
      }
      if (!r.ok) {
        const doc = new DOMParser().parseFromString(text, "text/html");
        banner.textContent = "Showing the last data: " + (doc.body.textContent.trim()
          || ("the plugin answered " + r.status));
        banner.hidden = false;
        state.classList.add("stale");
        return;
      }
      main.innerHTML = text;
      banner.hidden = true;
      state.classList.remove("stale");
      document.body.dataset.refreshed = String(Date.now());
    } catch (e) {
      banner.textContent = "Cannot reach the Airflow API server: " + e;
      banner.hidden = false;
      state.classList.add("stale");
    }
  }

  // Inside the Airflow UI (a same-origin frame), move the outer UI's router instead of
  // loading a second Airflow inside this frame.
  document.addEventListener("click", function (ev) {
    const a = ev.target.closest && ev.target.closest("a[data-top]");
    if (!a || window.top === window) return;
    try {
      window.top.history.pushState({}, "", a.getAttribute("href"));
      window.top.dispatchEvent(new PopStateEvent("popstate"));
      ev.preventDefault();
    } catch (e) { /* not reachable: follow the link inside the frame */ }
  });

  // Filter forms apply a choice at once; their values live in the URL, which the
  // refresh above reads again.
  document.addEventListener("change", function (ev) {
    const form = ev.target.form;
    if (form && form.hasAttribute("data-autosubmit") && ev.target.tagName === "SELECT") {
      form.requestSubmit();
    }
  });

  setInterval(refresh, every);
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) refresh();
  });
})();
