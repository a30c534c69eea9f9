// agent-intercom web console.
//
// A small vanilla front end over the HTTP API (/api/...) and the event
// stream (/api/events). Every piece of agent-supplied text is put into the
// page as text (textContent / text nodes), never as markup; the only HTML
// inserted is diff2html's output, which escapes the diff's content. Every
// API call carries the login's key (X-CSRF-Token): the cookie alone is not
// enough, because browsers send it to every port of this host.
'use strict';

(() => {
  // The login's key arrives once, in the fragment of the redirect after the
  // login (`/#key=...`), and is kept in localStorage, which is per origin
  // (port included), unlike the cookie. No page the server sends holds it.
  const KEY_ITEM = 'intercom-console-key';
  let CSRF = localStorage.getItem(KEY_ITEM);

  // Takes the key a login redirect handed over, only once it has opened the
  // API: a page elsewhere can open the console with a made-up `#key=`, and
  // storing that would log the operator out.
  async function adoptLoginKey() {
    const m = /^#key=([0-9a-f]{64})$/.exec(location.hash);
    if (!m) return;
    history.replaceState(null, '', location.pathname + '#/');
    try {
      const r = await fetch('/api/rules', {
        headers: { 'X-CSRF-Token': m[1] },
        credentials: 'same-origin',
        cache: 'no-store',
      });
      if (r.ok) {
        localStorage.setItem(KEY_ITEM, m[1]);
        CSRF = m[1];
      }
    } catch (_) {
      // not reachable: keep the key there was
    }
  }
  const view = document.getElementById('view');
  const state = {
    activity: {}, // session id -> last activity word (the stream's, else the session's live view)
    asked: new Set(), // live sessions whose state was read from their live view
    notified: new Set(), // request ids already notified
    lastId: null,
    current: null, // the view object in the page
  };

  // ---- DOM: elements from text, never from markup ----
  // Invisible formatting that makes text read other than it is (bidi
  // overrides, zero-width, tag characters): the same set as the server's
  // `intercom_actors::text::disguises`. Every string shown goes through h(),
  // which writes these as visible marks: `notes-\u202etxt.sh` shows as
  // `notes-⟨U+202E⟩txt.sh`, not as `notes-hs.txt`.
  const DISGUISES = /[\u{ad}\u{61c}\u{180e}\u{200b}\u{200e}\u{200f}\u{2028}-\u{202e}\u{2060}-\u{206f}\u{feff}\u{fff9}-\u{fffb}\u{e0000}-\u{e007f}]/gu;
  // A character shown by its code point: `⟨U+202E⟩`.
  function mark(c) {
    return '⟨U+' + c.codePointAt(0).toString(16).toUpperCase().padStart(4, '0') + '⟩';
  }
  function visible(text) {
    return text.replace(DISGUISES, mark);
  }

  // In what names a file or runs (paths, commands), also the joiners and
  // the fillers that draw nothing: `deploy\u200d.sh` must not read as
  // `deploy.sh`. Prose keeps its joiners (emoji and several scripts need
  // them).
  // Blanks other than the plain space too: a tab or a no-break space in
  // `README.md\tdeploy.sh` read as one name with a space.
  const EMPTY_IN_NAMES = /[\u{9}\u{a0}\u{34f}\u{115f}\u{1160}\u{2000}-\u{200a}\u{200c}\u{200d}\u{202f}\u{205f}\u{2800}\u{3000}\u{3164}\u{ffa0}]/gu;
  function visibleName(text) {
    return String(text).replace(EMPTY_IN_NAMES, mark);
  }

  // Control characters but tab and newline (ANSI escapes: invisible, and
  // OSC 8 leftovers read as links), marked like disguises.
  const CONTROLS = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g;
  function visibleControls(text) {
    return text.replace(CONTROLS, mark);
  }

  // Agent-chosen titles and paths are cut, so a huge one cannot push the
  // decision buttons off the page.
  function cut(text, max) {
    const s = String(text);
    return s.length <= max ? s : s.slice(0, max - 1) + '…';
  }

  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      // Control characters are marked in every text, not only in diffs:
      // ESC and BEL reached the transcript and the plan as they were.
      el.append(kid instanceof Node ? kid : visible(visibleControls(String(kid))));
    }
    return el;
  }

  function clear(el) {
    while (el.firstChild) el.removeChild(el.firstChild);
    return el;
  }

  function toast(text, bad) {
    const t = document.getElementById('toast');
    t.textContent = text;
    t.className = bad ? 'toast bad' : 'toast';
    t.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { t.hidden = true; }, 5000);
  }

  function ago(ms) {
    const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
    if (s < 60) return s + 's';
    if (s < 3600) return Math.floor(s / 60) + 'm ' + (s % 60) + 's';
    if (s < 86400) return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm';
    return Math.floor(s / 86400) + 'd';
  }

  function when(ms) {
    return new Date(ms).toLocaleString();
  }

  // ---- the API ----
  async function api(method, path, body) {
    const opts = { method, headers: { 'X-CSRF-Token': CSRF }, credentials: 'same-origin' };
    if (body !== undefined) {
      opts.headers['Content-Type'] = 'application/json';
      opts.body = JSON.stringify(body);
    }
    const r = await fetch(path, opts);
    if (r.status === 401) {
      location.href = '/login';
      throw new Error('logged out');
    }
    const text = await r.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
    if (!r.ok) throw new Error((data && data.error) || ('HTTP ' + r.status));
    // A paged list (the transcript, the approvals) names the page before
    // it in its Link header.
    if (Array.isArray(data)) {
      const prev = /<([^>]+)>;\s*rel="prev"/.exec(r.headers.get('Link') || '');
      data.earlier = !!prev;
      data.prev = prev ? prev[1] : null;
    }
    return data;
  }

  // Every page of a paged list (at most 100 pages), newest first.
  async function apiAll(path) {
    const all = [];
    let next = path;
    for (let i = 0; i < 100 && next; i++) {
      const page = await api('GET', next);
      all.push(...page);
      next = page.prev;
    }
    return all;
  }

  function act(label, method, path, body, after) {
    return async () => {
      try {
        const answer = await api(method, path, body && body());
        toast(label + ': done');
        if (after) after(answer);
      } catch (e) {
        toast(label + ': ' + e.message, true);
      }
      refreshSoon();
    };
  }

  // ---- the event stream ----
  function setConn(text, live) {
    const c = document.getElementById('conn');
    c.textContent = text;
    c.className = live ? 'conn live' : 'conn';
  }

  // The stream is read with fetch, not EventSource, which cannot send the
  // key. A block of `field: value` lines ends with a blank line; `id`
  // moves the position (the first block is a marker with only an id), and
  // a reconnect resumes after it.
  async function connect() {
    const url = state.lastId === null ? '/api/events' : '/api/events?after=' + state.lastId;
    try {
      const r = await fetch(url, {
        headers: { 'X-CSRF-Token': CSRF, Accept: 'text/event-stream' },
        credentials: 'same-origin',
        cache: 'no-store',
      });
      if (r.status === 401) {
        location.href = '/login';
        return;
      }
      if (!r.ok || !r.body) throw new Error('HTTP ' + r.status);
      setConn('live', true);
      refreshSoon();
      await readStream(r.body.pipeThrough(new TextDecoderStream()).getReader());
    } catch (_) {
      // dropped or refused: try again below
    }
    setConn('reconnecting…', false);
    setTimeout(connect, 2000);
  }

  async function readStream(reader) {
    let rest = '';
    let data = [];
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      const lines = (rest + value).split('\n');
      rest = lines.pop();
      for (const raw of lines) {
        const line = raw.endsWith('\r') ? raw.slice(0, -1) : raw;
        if (line === '') {
          if (data.length) {
            let e = null;
            try { e = JSON.parse(data.join('\n')); } catch (_) { e = null; }
            if (e) onEvent(e);
          }
          data = [];
          continue;
        }
        const colon = line.indexOf(':');
        if (colon === 0) continue; // a comment (keep-alive)
        const field = colon < 0 ? line : line.slice(0, colon);
        let v = colon < 0 ? '' : line.slice(colon + 1);
        if (v.startsWith(' ')) v = v.slice(1);
        if (field === 'data') data.push(v);
        else if (field === 'id' && /^\d+$/.test(v)) state.lastId = Number(v);
      }
    }
  }

  function onEvent(e) {
    const sid = e.session_id;
    switch (e.event) {
      case 'status_changed':
        state.activity[sid] = e.activity;
        break;
      case 'request_opened':
        notify(e.request);
        break;
      case 'events_lost':
        // The journal no longer had what this page missed: read it all again.
        refreshSoon();
        break;
      default:
        break;
    }
    if (state.current && state.current.wants(e)) refreshSoon();
  }

  function notify(request) {
    if (!('Notification' in window) || Notification.permission !== 'granted') return;
    if (state.notified.has(request.id)) return;
    state.notified.add(request.id);
    const n = new Notification('Needs input: ' + visible(cut(request.title, 120)), {
      body: 'Session ' + request.session_id + ' is waiting for a decision.',
      tag: request.id,
    });
    n.onclick = () => { window.focus(); location.hash = '#/s/' + encodeURIComponent(request.session_id); };
  }

  let refreshTimer = null;
  // At most one refresh per 120 ms, and always within 120 ms of the first
  // event that asked for one: a timer restarted by every event (a debounce)
  // never fired while one busy agent streamed faster than that, and a
  // session that needed input stayed out of the list.
  function refreshSoon() {
    if (refreshTimer !== null) return;
    refreshTimer = setTimeout(() => {
      refreshTimer = null;
      if (state.current) state.current.refresh().catch((e) => toast(e.message, true));
    }, 120);
  }

  // ---- sessions ----
  const RANK = {
    'needs input': 0, working: 1, starting: 1, active: 2, idle: 2, paused: 3,
    stalled: 4, crashed: 5, error: 5, interrupted: 5, completed: 6, cancelled: 6,
  };

  // A session's live view says what the stream has not said since the page
  // loaded: after a reload a paused session read "active".
  function liveActivity(live) {
    if (live.paused) return 'paused';
    return live.turn_running ? 'working' : 'idle';
  }

  function stateOf(s, waiting) {
    if (waiting) return 'needs input';
    const live = ['starting', 'active', 'stalled', 'paused'].includes(s.status);
    if (!live) return s.status;
    if (s.status !== 'active') return s.status;
    if (s.live && s.live.paused) return 'paused';
    const a = state.activity[s.id];
    if (a && a !== 'needs input') return a;
    return s.live ? liveActivity(s.live) : 'active';
  }

  // Reads, once per page load, the live view of active sessions the stream
  // has said nothing about (at most 50 at a time), then draws again.
  const MAX_ASKED = 50;
  function learnActivity(sessions, redraw) {
    const unknown = sessions.filter((s) => s.status === 'active'
      && state.activity[s.id] === undefined && !state.asked.has(s.id)).slice(0, MAX_ASKED);
    if (unknown.length === 0) return;
    for (const s of unknown) state.asked.add(s.id);
    Promise.all(unknown.map((s) => api('GET', '/api/sessions/' + encodeURIComponent(s.id))
      .then((d) => {
        if (d.live && state.activity[s.id] === undefined) state.activity[s.id] = liveActivity(d.live);
      })
      .catch(() => {}))).then(redraw);
  }

  function sessionsView() {
    const body = h('tbody');
    const root = h('section', {},
      h('h2', {}, 'Sessions'),
      h('table', { class: 'list', id: 'sessions' },
        h('thead', {}, h('tr', {}, ['State', 'Title', 'Workspace', 'Agent', 'Owner', 'Restarts', 'Last activity'].map((c) => h('th', {}, c)))),
        body));
    let rows = [];
    async function refresh() {
      const [sessions, pending] = await Promise.all([
        api('GET', '/api/sessions?all=true'),
        // Who waits since when; the diffs would be megabytes per refresh.
        apiAll('/api/approvals?status=pending&brief=true'),
      ]);
      const waiting = {};
      for (const p of pending) {
        if (!waiting[p.session_id] || p.created_at < waiting[p.session_id]) waiting[p.session_id] = p.created_at;
      }
      const order = () => {
        rows = sessions.map((s) => ({ s, since: waiting[s.id], st: stateOf(s, waiting[s.id]) }));
        rows.sort((a, b) => (RANK[a.st] ?? 9) - (RANK[b.st] ?? 9)
          || (a.since ?? 0) - (b.since ?? 0) || b.s.last_activity_at - a.s.last_activity_at);
        draw();
      };
      order();
      learnActivity(sessions, order);
    }
    function draw() {
      clear(body);
      if (rows.length === 0) body.append(h('tr', {}, h('td', { colspan: 7, class: 'empty' }, 'No sessions yet. Start one.')));
      for (const { s, since, st } of rows) {
        const label = since ? 'needs input · waiting ' + ago(since) : st;
        body.append(h('tr', { class: 'row state-' + st.replace(/\s/g, '-'), 'data-session': s.id, onclick: () => { location.hash = '#/s/' + encodeURIComponent(s.id); } },
          h('td', {}, h('span', { class: 'badge state-' + st.replace(/\s/g, '-') }, label)),
          h('td', {}, h('a', { href: '#/s/' + encodeURIComponent(s.id), class: 'title' }, cut(s.title || s.id, 200))),
          h('td', {}, s.workspace), h('td', {}, s.agent), h('td', {}, s.owner),
          h('td', {}, String(s.restart_count)), h('td', {}, ago(s.last_activity_at) + ' ago')));
      }
    }
    const tick = setInterval(draw, 1000);
    return { root, refresh, wants: () => true, stop: () => clearInterval(tick) };
  }

  // ---- one session ----
  // The server's diffs are plain unified diffs: a new file is `--- /dev/null`.
  // diff2html marks a file added only after git's `new file mode` line (else
  // the differing names read as a rename), and once it has seen one git
  // header it reads a later plain `--- a/x` header as lines of the file
  // before: a new README.md followed by an edit of deploy.sh showed as one
  // harmless new file with the edit inside. So every file gets git's
  // `diff --git` line (and new or deleted files their mode line) before
  // rendering. Only real file headers: inside a hunk (its line counts not
  // yet used up) a line `--- /dev/null` is a removed line `-- /dev/null` of
  // the agent's text, and treating it as a header let an agent show an edit
  // of deploy.sh as a new, other file.
  function gitHeaders(diff) {
    const lines = diff.split('\n');
    const out = [];
    let oldLeft = 0;
    let newLeft = 0;
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      if (oldLeft > 0 || newLeft > 0) {
        const c = line[0];
        if (c === '-') oldLeft--;
        else if (c === '+') newLeft--;
        else if (c !== '\\') { oldLeft--; newLeft--; }
        out.push(line);
        continue;
      }
      const hunk = /^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@/.exec(line);
      if (hunk) {
        oldLeft = hunk[1] === undefined ? 1 : Number(hunk[1]);
        newLeft = hunk[2] === undefined ? 1 : Number(hunk[2]);
        out.push(line);
        continue;
      }
      const from = /^--- (\S.*)$/.exec(line);
      const to = from && /^\+\+\+ (\S.*)$/.exec(lines[i + 1] || '');
      if (from && to) {
        const a = from[1] === '/dev/null' ? to[1].replace(/^b\//, 'a/') : from[1];
        const b = to[1] === '/dev/null' ? from[1].replace(/^a\//, 'b/') : to[1];
        out.push('diff --git ' + a + ' ' + b);
        if (from[1] === '/dev/null') out.push('new file mode 100644');
        else if (to[1] === '/dev/null') out.push('deleted file mode 100644');
      }
      out.push(line);
    }
    return out.join('\n');
  }

  // The most diff lines rendered at once: diff2html made about 20 DOM
  // elements a line, and an 85,000-line diff froze the page for a minute.
  // Past it, the first lines and a button for the rest.
  const DIFF_LINES_SHOWN = 3000;

  function renderDiff(diff, whole) {
    const lines = diff.split('\n');
    if (!whole && lines.length > DIFF_LINES_SHOWN) {
      const box = renderDiff(lines.slice(0, DIFF_LINES_SHOWN).join('\n'), true);
      const rest = h('button', { type: 'button', class: 'diff-more' },
        'Show all ' + lines.length + ' lines (' + (lines.length - DIFF_LINES_SHOWN) + ' more; slow)');
      rest.onclick = () => box.replaceWith(renderDiff(diff, true));
      box.append(rest);
      return box;
    }
    const box = h('div', { class: 'diff' });
    if (window.Diff2Html) {
      // diff2html escapes the diff's text; its output is trusted markup.
      // Disguises and control characters are marked first: diff2html's
      // output does not pass through h(), and a bidi override in a path or a
      // line (Trojan Source) would read other than it is.
      box.innerHTML = window.Diff2Html.html(gitHeaders(namesMarked(visibleControls(visible(diff)))), { drawFileList: false, matching: 'lines', outputFormat: 'line-by-line' });
    } else {
      box.append(h('pre', {}, diff));
    }
    return box;
  }

  // The file names of a diff (its header lines) with joiners and blank
  // fillers marked, as in the paths line: the lines' content keeps them.
  function namesMarked(diff) {
    return diff.split('\n').map((l) => (/^(--- |\+\+\+ |diff )/.test(l) ? visibleName(l) : l)).join('\n');
  }

  // A collapsed diff of the transcript is rendered when first opened, not
  // with the page: a session of many big tool calls rebuilt them all on
  // every refresh.
  function lazyDiff(diff) {
    const box = h('details', { class: 'tool-diff' }, h('summary', {}, 'diff'));
    box.addEventListener('toggle', () => {
      if (box.open && box.childElementCount === 1) box.append(renderDiff(diff));
    });
    return box;
  }

  // The command a request runs (what the rules judged), shown apart from
  // its title, which is cut: a command padded past the cut hid its end.
  // Runs of more than 8 blanks are counted (as the server's
  // `text::command::marked` does), and a very long command keeps its start
  // and its end, saying how much lies between.
  const BLANK_RUN = /[\s\u{34f}\u{115f}\u{1160}\u{200b}-\u{200d}\u{2060}\u{2800}\u{3164}\u{fe00}-\u{fe0f}\u{feff}\u{ffa0}]{9,}/gu;
  function commandText(cmd) {
    // Blank: whitespace of every kind (newlines, no-break and ideographic
    // spaces) and the fillers and joiners that render empty, as the
    // server's `is_blank`.
    const s = visibleName(String(cmd).replace(BLANK_RUN, (run) => '⟨' + [...run].length + ' blanks⟩'));
    const max = 20000;
    if (s.length <= max) return s;
    const head = s.slice(0, max - max / 4), tail = s.slice(s.length - max / 4);
    return head + '\n… ' + (s.length - head.length - tail.length) +
      ' characters not shown here; the API has the whole command …\n' + tail;
  }

  // Line breaks run a second command in a shell, and the title (one line,
  // its whitespace folded) shows them as spaces.
  const LINE_BREAK = /[\n\r\v\f\u{85}\u{2028}\u{2029}]/u;

  function commandView(req) {
    if (!req.command) return null;
    const shown = commandText(req.command);
    // The title already shows a short plain one-line command whole.
    const plain = shown === req.command && !LINE_BREAK.test(req.command);
    if (req.title.length <= 300 && plain) return null;
    return h('pre', { class: 'command' }, 'runs: ' + shown);
  }

  function parse(text) {
    try { return JSON.parse(text); } catch (_) { return null; }
  }

  function requestCard(req, onAlways) {
    const feedback = h('textarea', { class: 'feedback', rows: 2, placeholder: 'Feedback for the agent: why you reject (needed for "Reject with feedback")' });
    const decide = (o) => act(o.label || o.name, 'POST', '/api/approvals/' + encodeURIComponent(req.id), () => ({ option_id: o.id }),
      (answer) => { if (o.kind.endsWith('_always') && answer && answer.status === 'decided') onAlways(req, o); });
    const buttons = req.options.map((o) => h('button', {
      type: 'button', class: 'opt ' + o.kind, 'data-option': o.id,
      onclick: decide(o),
    }, o.label || o.name));
    return h('div', { class: 'request', 'data-request': req.id },
      h('div', { class: 'request-head' },
        h('span', { class: 'badge state-needs-input' }, req.kind.replace('_', ' ')),
        h('strong', { class: 'request-title' }, cut(req.title, 300)),
        h('span', { class: 'muted' }, ' waiting ' + ago(req.created_at))),
      commandView(req),
      req.paths && req.paths.length ? h('div', { class: 'paths' }, visibleName(cut(req.paths.join(', '), 2000))) : null,
      req.diff ? renderDiff(req.diff) : null,
      h('div', { class: 'options' }, buttons),
      h('div', { class: 'reject-feedback' }, feedback,
        h('button', {
          type: 'button', class: 'reject-with-feedback',
          // Without feedback this button would be a plain reject: say so
          // instead of rejecting with nothing for the agent to read.
          onclick: () => {
            if (!feedback.value.trim()) {
              toast('Reject with feedback: write the feedback first (or use the reject option above)', true);
              feedback.focus();
              return;
            }
            act('Rejected', 'POST', '/api/approvals/' + encodeURIComponent(req.id),
              () => ({ decision: 'reject', reason: feedback.value }))();
          },
        }, 'Reject with feedback')));
  }

  function entryView(m) {
    const time = h('span', { class: 'time' }, new Date(m.created_at).toLocaleTimeString());
    if (m.kind === 'tool') {
      const t = parse(m.content) || {};
      return h('div', { class: 'entry tool' }, time,
        h('span', { class: 'badge tool-' + (t.status || 'pending') }, t.status || 'pending'), ' ',
        h('strong', {}, cut(t.title || t.id || 'tool call', 300)),
        t.kind ? h('span', { class: 'muted' }, ' (' + t.kind + ')') : null,
        t.paths && t.paths.length ? h('div', { class: 'paths' }, visibleName(cut(t.paths.join(', '), 2000))) : null,
        (t.diffs || []).map((d) => lazyDiff(d)));
    }
    if (m.kind === 'plan') {
      return h('div', { class: 'entry plan-note muted' }, time, 'plan updated');
    }
    if (m.kind === 'thought' || m.kind === 'thinking') {
      return h('details', { class: 'entry thought' }, h('summary', {}, time, 'thought'), h('div', { class: 'text' }, m.content));
    }
    if (m.kind === 'text' || m.kind === 'error') {
      return h('div', { class: 'entry ' + m.role + ' ' + m.kind }, time,
        h('span', { class: 'role' }, m.role), h('div', { class: 'text' }, m.content));
    }
    return h('details', { class: 'entry other' }, h('summary', {}, time, m.role + ' · ' + m.kind), h('div', { class: 'text' }, m.content));
  }

  const PLAN_STATUSES = new Set(['pending', 'in_progress', 'completed']);

  function planView(messages) {
    const plans = messages.filter((m) => m.kind === 'plan');
    if (plans.length === 0) return null;
    const entries = parse(plans[plans.length - 1].content) || [];
    // The agent names each status: only the schema's own become a class
    // (a probe's `x toast` drew an entry as the console's decision toast).
    return h('ul', { class: 'plan' }, entries.map((e) => h('li', { class: 'plan-' + (PLAN_STATUSES.has(e.status) ? e.status : 'other') },
      h('input', { type: 'checkbox', disabled: true, checked: e.status === 'completed' }), ' ', cut(e.content, 500),
      h('span', { class: 'muted' }, ' ' + e.status))));
  }

  function sessionView(id) {
    const enc = encodeURIComponent(id);
    const head = h('div', { class: 'session-head' });
    const pendingBox = h('div', { class: 'pending' });
    const planBox = h('div', { class: 'plan-box' });
    const transcript = h('div', { class: 'transcript', id: 'transcript' });
    const steerList = h('ul', { class: 'steering-list' });
    const steerText = h('textarea', { id: 'steer-text', rows: 3, placeholder: 'Steer the agent: delivered now when it is idle, queued behind a running turn' });
    const interrupt = h('input', { type: 'checkbox', id: 'steer-interrupt' });
    const steerResult = h('span', { class: 'steer-result', id: 'steer-result' });
    const mode = h('select', { id: 'mode' }, ['ask', 'auto-edits', 'auto'].map((m) => h('option', { value: m }, m)));
    let modeShown = null; // the mode the select last showed from the server
    const rememberBox = h('div', { class: 'remember-box' });
    // Stop and Restart cut a running turn: asked once more before, as a
    // stray click on them cannot be taken back.
    const control = (label, path, question) => {
      const run = act(label, 'POST', '/api/sessions/' + enc + '/' + path, () => ({}));
      return h('button', { type: 'button', class: 'control', 'data-control': path,
        onclick: () => (question && !window.confirm(question) ? toast(label + ': not done') : run()) }, label);
    };
    const root = h('section', { class: 'session' },
      head,
      h('div', { class: 'controls' },
        control('Stop', 'cancel', 'Stop this session? Its turn is cancelled and the session ends for good (Revive does not bring it back).'),
        control('Pause', 'pause'), control('Resume', 'resume'), control('Nudge', 'nudge'),
        control('Restart', 'restart', 'Restart the agent? Its process is killed and started again, resuming this session; the turn it is in is cut.'),
        control('Revive', 'revive'),
        h('span', { class: 'mode-control' },
          h('label', {}, ' approval mode ', mode),
          h('button', { type: 'button', id: 'mode-set', onclick: act('Mode', 'POST', '/api/sessions/' + enc + '/mode', () => ({ mode: mode.value })) }, 'Set'))),
      rememberBox,
      h('h3', {}, 'Waiting for you'), pendingBox,
      h('h3', {}, 'Plan'), planBox,
      h('h3', {}, 'Transcript'), transcript,
      h('div', { class: 'steer-box' },
        h('h3', {}, 'Steer'),
        h('div', { class: 'steer' }, steerText,
          h('div', {}, h('label', {}, interrupt, ' interrupt the running turn'), ' ',
            h('button', { type: 'button', id: 'steer-send', onclick: steer }, 'Send'), ' ', steerResult),
          steerList)));
    const cards = new Map();

    // After an "always" decision: keep it as a rule, as Slack offers.
    function offerRemember(req, option) {
      const box = h('div', { class: 'remember', 'data-remember': req.id });
      const result = h('span', { class: 'remember-result' });
      const remember = (scope) => async () => {
        try {
          const r = await api('POST', '/api/approvals/' + encodeURIComponent(req.id) + '/remember', { scope });
          clear(result).append((r.created ? 'Remembered as rule ' : 'Already remembered as rule ') + r.rule.id
            + ': matching requests are answered without asking (the Rules view removes it).');
          for (const b of box.querySelectorAll('button')) b.disabled = true;
        } catch (e) {
          clear(result).append(e.message);
        }
      };
      box.append(
        h('div', {}, '"' + (option.label || option.name) + '" on ', h('strong', {}, cut(req.title, 300)),
          '. Make it stick: remember this decision as a rule, so matching requests are answered without asking.'),
        h('div', { class: 'options' },
          h('button', { type: 'button', 'data-remember-scope': 'session', onclick: remember('session') }, 'Remember for this session'),
          h('button', { type: 'button', 'data-remember-scope': 'workspace', onclick: remember('workspace') }, 'Remember for the workspace'),
          h('button', { type: 'button', class: 'dismiss', onclick: () => box.remove() }, 'Not now')),
        result);
      rememberBox.append(box);
    }

    async function steer() {
      const text = steerText.value;
      if (!text.trim()) return;
      try {
        const r = await api('POST', '/api/sessions/' + enc + '/prompt', { text, interrupt: interrupt.checked });
        steerText.value = '';
        steerResult.textContent = r.paused ? 'held: the session is paused; delivered after Resume'
          : r.queued && interrupt.checked ? 'queued: the running turn is being cancelled; delivered as soon as it ends'
            : r.queued ? 'queued: delivered when the running turn ends' : 'delivered';
      } catch (e) {
        steerResult.textContent = e.message;
      }
      refreshSoon();
    }

    function drawHead(d) {
      const st = stateOf(d, d.pending.length ? d.pending[0].created_at : null);
      clear(head).append(
        h('h2', { class: 'session-title' }, cut(d.title || d.id, 300)),
        h('div', { class: 'facts' },
          h('span', { class: 'badge state-' + st.replace(/\s/g, '-'), id: 'session-state' }, st),
          h('span', {}, 'status ' + d.status + (d.status_reason ? ' (' + d.status_reason + ')' : '')),
          h('span', {}, 'workspace ' + d.workspace), h('span', {}, 'agent ' + d.agent),
          h('span', {}, 'owner ' + d.owner), h('span', {}, 'restarts ' + d.restart_count),
          h('span', { id: 'session-mode' }, 'mode ' + d.approval_mode),
          d.live ? h('span', {}, d.live.turn_running ? 'turn running' : 'idle') : null,
          d.live && d.live.queued_prompts ? h('span', {}, d.live.queued_prompts + ' queued') : null,
          h('span', { class: 'muted' }, id)));
      // Only what can be done now: controls of a running session while it
      // runs, Revive once it ended without being stopped (the server says).
      const live = ['starting', 'active', 'stalled'].includes(d.status);
      const revivable = !!d.revivable;
      const paused = !!(d.live && d.live.paused);
      const shown = { revive: revivable, pause: live && !paused, resume: live && paused };
      for (const b of root.querySelectorAll('button.control')) {
        const c = b.dataset.control;
        b.hidden = !(c in shown ? shown[c] : live);
      }
      // A session that ended for good takes no mode and no steering (both
      // were offered, and answered "start a new one").
      const over = !live && !revivable;
      root.querySelector('.mode-control').hidden = over;
      root.querySelector('.steer-box').hidden = over;
    }

    function drawPending(pending) {
      const ids = new Set(pending.map((p) => p.id));
      for (const [rid, el] of cards) {
        if (!ids.has(rid)) { el.remove(); cards.delete(rid); }
      }
      for (const p of pending) {
        if (!cards.has(p.id)) {
          const card = requestCard(p, offerRemember);
          cards.set(p.id, card);
          pendingBox.append(card);
        }
      }
      const none = pendingBox.querySelector('.none');
      if (pending.length === 0 && !none) pendingBox.append(h('p', { class: 'none muted' }, 'Nothing is waiting.'));
      if (pending.length > 0 && none) none.remove();
    }

    function drawSteering(steering) {
      clear(steerList);
      for (const s of steering) {
        const delivered = s.delivered_at !== null && s.delivered_at !== undefined;
        steerList.append(h('li', { 'data-steering': s.id, class: delivered ? 'delivered' : 'queued' },
          h('span', { class: 'badge' }, delivered ? 'delivered' : 'queued'), ' ', s.text,
          h('span', { class: 'muted' }, ' ' + s.author + ', ' + when(s.created_at))));
      }
    }

    function drawMode(current) {
      if (mode.value === modeShown || modeShown === null) mode.value = current;
      modeShown = current;
      mode.dataset.current = current;
    }

    // The transcript is read a page at a time (the newest by default);
    // "Show earlier entries" adds the page before what is shown. The plan is
    // read apart (the latest plan entry), so it shows however old it is.
    let older = [];
    let olderMore = false;

    async function showEarlier(firstId) {
      const page = await api('GET', '/api/sessions/' + enc + '/messages?before=' + firstId);
      older = page.concat(older);
      olderMore = page.earlier;
      await refresh();
    }

    // The server tells watchers of agent text when a block ends; while a
    // turn runs, the page reads the transcript again every 2 s so a long
    // answer grows on screen (it read "tick 0" while `ctl log` had ten).
    let working = false;
    const poll = setInterval(() => { if (working && !document.hidden) refreshSoon(); }, 2000);

    async function refresh() {
      const [d, latest, steering, plans] = await Promise.all([
        api('GET', '/api/sessions/' + enc),
        api('GET', '/api/sessions/' + enc + '/messages'),
        api('GET', '/api/sessions/' + enc + '/steering'),
        api('GET', '/api/sessions/' + enc + '/messages?kind=plan&limit=1'),
      ]);
      working = stateOf(d, d.pending.length ? d.pending[0].created_at : null) === 'working';
      drawHead(d);
      drawMode(d.approval_mode);
      drawPending(d.pending);
      clear(planBox).append(planView(plans) || h('p', { class: 'muted' }, 'No plan yet.'));
      const first = latest.length ? latest[0].id : Infinity;
      const messages = older.filter((m) => m.id < first).concat(latest);
      const earlier = older.length ? olderMore : latest.earlier;
      const atBottom = transcript.scrollTop + transcript.clientHeight >= transcript.scrollHeight - 20;
      clear(transcript).append(...messages.map(entryView));
      if (earlier && messages.length) {
        transcript.prepend(h('p', { class: 'muted', id: 'transcript-earlier' },
          'Earlier entries are not shown. ',
          h('button', { type: 'button', id: 'transcript-more', onclick: () => showEarlier(messages[0].id) },
            'Show earlier entries')));
      }
      if (atBottom) transcript.scrollTop = transcript.scrollHeight;
      drawSteering(steering);
    }
    return { root, refresh, wants: (e) => e.session_id === id, stop: () => clearInterval(poll) };
  }

  // ---- rules ----
  function rulesView() {
    const body = h('tbody');
    const scope = h('select', { id: 'rule-scope' }, ['global', 'workspace', 'session'].map((s) => h('option', { value: s }, s)));
    const scopeId = h('input', { id: 'rule-scope-id', placeholder: 'workspace or session id' });
    const kind = h('input', { id: 'rule-kind', placeholder: 'kind: edit, execute, read, ... (optional)' });
    const paths = h('input', { id: 'rule-paths', placeholder: 'paths (globs, comma-separated, optional)' });
    const prefix = h('input', { id: 'rule-prefix', placeholder: 'command prefix (optional)' });
    const action = h('select', { id: 'rule-action' }, ['allow', 'ask', 'deny'].map((s) => h('option', { value: s }, s)));
    const ruleBody = () => {
      const match = {};
      if (kind.value.trim()) match.kind = kind.value.trim();
      const p = paths.value.split(',').map((x) => x.trim()).filter(Boolean);
      if (p.length) match.paths = p;
      if (prefix.value.trim()) match.command_prefix = prefix.value.trim();
      const b = { scope: scope.value, match, action: action.value };
      if (scope.value !== 'global') b.scope_id = scopeId.value.trim();
      return b;
    };
    const root = h('section', {},
      h('h2', {}, 'Rules in force'),
      h('table', { class: 'list', id: 'rules' },
        h('thead', {}, h('tr', {}, ['Id', 'Scope', 'Match', 'Action', 'Source', ''].map((c) => h('th', {}, c)))), body),
      h('h3', {}, 'Add a rule'),
      h('div', { class: 'form' }, scope, scopeId, kind, paths, prefix, action,
        h('button', { type: 'button', id: 'rule-add', onclick: act('Rule added', 'POST', '/api/rules', ruleBody) }, 'Add')),
      h('p', { class: 'muted' }, 'Order: any matching deny wins; else the most specific scope (session, workspace, global); ask before allow.'));
    async function refresh() {
      const rules = await api('GET', '/api/rules');
      clear(body);
      for (const r of rules) {
        const scopeText = r.scope && typeof r.scope === 'object' ? JSON.stringify(r.scope) : String(r.scope) + (r.scope_id ? ' ' + r.scope_id : '');
        body.append(h('tr', { 'data-rule': r.id },
          h('td', {}, r.id), h('td', {}, scopeText), h('td', {}, JSON.stringify(r.match || {})),
          h('td', {}, r.action), h('td', {}, r.source),
          h('td', {}, r.source === 'config' ? h('span', { class: 'muted' }, 'edit the config file')
            : h('button', { type: 'button', onclick: act('Rule removed', 'DELETE', '/api/rules/' + encodeURIComponent(r.id)) }, 'Remove'))));
      }
    }
    return { root, refresh, wants: () => false, stop: () => {} };
  }

  // ---- audit ----
  function auditView() {
    const body = h('tbody');
    const filter = h('input', { id: 'audit-session', placeholder: 'session id (all when empty)' });
    const root = h('section', {},
      h('h2', {}, 'Audit'),
      h('div', { class: 'form' }, filter, h('button', { type: 'button', onclick: () => refreshSoon() }, 'Filter')),
      h('table', { class: 'list', id: 'audit' },
        h('thead', {}, h('tr', {}, ['When', 'Session', 'Who', 'What', 'Detail'].map((c) => h('th', {}, c)))), body));
    async function refresh() {
      const q = filter.value.trim() ? '?session=' + encodeURIComponent(filter.value.trim()) : '';
      const entries = await api('GET', '/api/audit' + q);
      clear(body);
      for (const a of entries.slice(0, 500)) {
        body.append(h('tr', {}, h('td', {}, when(a.at)), h('td', {}, a.session_id || ''), h('td', {}, a.actor),
          h('td', {}, a.action), h('td', { class: 'detail' }, JSON.stringify(a.detail))));
      }
    }
    return { root, refresh, wants: (e) => e.event === 'request_closed', stop: () => {} };
  }

  // ---- start a session ----
  function newView() {
    // The ids offered come from the config in force (GET /api/workspaces,
    // /api/agents); any other text is still sent, and refused with the
    // server's reason.
    const workspaceIds = h('datalist', { id: 'workspace-ids' });
    const agentIds = h('datalist', { id: 'agent-ids' });
    const target = h('input', { id: 'new-workspace', list: 'workspace-ids', placeholder: 'workspace id, or a directory under workspace_root' });
    const isPath = h('input', { type: 'checkbox', id: 'new-is-path' });
    const agent = h('input', { id: 'new-agent', list: 'agent-ids', placeholder: "agent profile (default: the workspace's)" });
    const mode = h('select', { id: 'new-mode' }, h('option', { value: '' }, "workspace's mode"), ['ask', 'auto-edits', 'auto'].map((m) => h('option', { value: m }, m)));
    const prompt = h('textarea', { id: 'new-prompt', rows: 4, placeholder: 'What should the agent do?' });
    const status = h('span', { class: 'muted', id: 'new-status' });
    async function start() {
      const body = { prompt: prompt.value };
      body[isPath.checked ? 'path' : 'workspace'] = target.value.trim();
      if (agent.value.trim()) body.agent = agent.value.trim();
      if (mode.value) body.mode = mode.value;
      status.textContent = 'starting the agent…';
      try {
        const s = await api('POST', '/api/sessions', body);
        location.hash = '#/s/' + encodeURIComponent(s.id);
      } catch (e) {
        status.textContent = e.message;
      }
    }
    const root = h('section', {},
      h('h2', {}, 'Start a session'),
      h('div', { class: 'form column' },
        h('label', {}, 'Workspace ', target), h('label', {}, isPath, ' it is a directory under workspace_root'),
        h('label', {}, 'Agent ', agent), h('label', {}, 'Approval mode ', mode),
        h('label', {}, 'Prompt', prompt),
        h('div', {}, h('button', { type: 'button', id: 'new-start', onclick: start }, 'Start'), ' ', status)),
      workspaceIds, agentIds);
    async function refresh() {
      const [workspaces, agents] = await Promise.all([api('GET', '/api/workspaces'), api('GET', '/api/agents')]);
      clear(workspaceIds).append(...workspaces.map((w) => h('option', { value: w.id }, w.id + ' (' + w.approval_mode + ')')));
      clear(agentIds).append(...agents.map((a) => h('option', { value: a.id }, a.id + (a.default ? ' (default)' : ''))));
      if (!target.value && workspaces.length) target.value = workspaces[0].id;
    }
    return { root, refresh, wants: () => false, stop: () => {} };
  }

  // ---- routing ----
  function route() {
    if (state.current) state.current.stop();
    const hash = location.hash || '#/';
    let v;
    let nav = 'sessions';
    if (hash.startsWith('#/s/')) v = sessionView(decodeURIComponent(hash.slice(4)));
    else if (hash === '#/rules') { v = rulesView(); nav = 'rules'; }
    else if (hash === '#/audit') { v = auditView(); nav = 'audit'; }
    else if (hash === '#/new') { v = newView(); nav = 'new'; }
    else v = sessionsView();
    for (const a of document.querySelectorAll('[data-nav]')) a.classList.toggle('active', a.dataset.nav === nav);
    state.current = v;
    clear(view).append(v.root);
    v.refresh().catch((e) => toast(e.message, true));
  }

  function setupChrome() {
    const n = document.getElementById('notify');
    if (!('Notification' in window) || Notification.permission !== 'default') n.hidden = true;
    n.addEventListener('click', async () => {
      await Notification.requestPermission();
      n.hidden = Notification.permission !== 'default';
    });
    document.getElementById('logout').addEventListener('click', async () => {
      await fetch('/logout', { method: 'POST', headers: { 'X-CSRF-Token': CSRF }, credentials: 'same-origin' });
      localStorage.removeItem(KEY_ITEM);
      location.href = '/login';
    });
  }

  adoptLoginKey().then(() => {
    if (!CSRF) {
      location.href = '/login';
      return;
    }
    window.addEventListener('hashchange', route);
    setupChrome();
    route();
    connect();
  });
})();
