// memvault as the backend of @anthropic-ai/sdk's memory tool.
//
// `MemvaultMemory` starts one `memvault serve` process and forwards every
// memory command to it as one JSON line, reading back the `tool_result` line
// memvault writes; or, given a `url` and a bearer `token`, posts every
// command to a `memvault server` (`POST /v1/memory`) instead.
// `memory.tool()` is the SDK's `betaMemoryTool(handlers)`, every command (an
// unknown one too) forwarded to memvault as it came: pass it in
// `tools` to `client.beta.messages.toolRunner(...)`. A success resolves to
// the result text (or image blocks); an error result is thrown as the SDK's
// `ToolError`, so the runner sends it to Claude with `is_error: true`, word
// for word.
//
//   import Anthropic from '@anthropic-ai/sdk';
//   import { MemvaultMemory } from './memvault-memory.mjs';
//
//   await using memory = new MemvaultMemory({ vault: 'vault', keyFile: 'vault.key', session: 'ticket-4711' });
//   const final = await new Anthropic().beta.messages.toolRunner({
//     model: 'claude-sonnet-4-5', max_tokens: 2048, tools: [memory.tool()],
//     messages: [{ role: 'user', content: 'Help me with this ticket.' }],
//   });
//
//   // HTTP mode: the token may also come from $MEMVAULT_TOKEN, the url from $MEMVAULT_URL.
//   await using memory = new MemvaultMemory({ url: 'http://127.0.0.1:8700', token, session: 'ticket-4711' });
//
// Promises (process mode): one server for the object's lifetime (the vault
// is unlocked once); requests are written in call order and answers matched
// by id, so concurrent calls are safe; `close()` ends input and waits for
// the server to exit (it kills it only after `timeoutMs`); a server that
// died, hung or answered out of step rejects with a `MemvaultServerError`
// naming the exit status and the server's last diagnostic lines (memvault
// never writes memory content or secrets to stderr), and so does every
// later call.
// In HTTP mode: session and actor travel as the `Memvault-Session` and
// `Memvault-Actor` headers; requests go out concurrently over fetch's
// keep-alive connections; an answer other than 200, a failed connection and
// a server silent past `timeoutMs` reject with a `MemvaultServerError`
// carrying the HTTP status (`.status`, undefined when there was no answer)
// and the server's `{"error"}` message, and the next call tries again. The
// token is sent only in the `Authorization` header, never in a message.
// Plain ES module with JSDoc types: runs on Node.js 20+ without a build step.

import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { createInterface } from 'node:readline';
import { betaMemoryTool } from '@anthropic-ai/sdk/helpers/beta/memory';
import { ToolError } from '@anthropic-ai/sdk/lib/tools/ToolError';

/**
 * The `memvault serve` process is gone, hung or out of step; or (HTTP mode)
 * the `memvault server` refused a request, could not be reached or gave no
 * answer in time.
 */
export class MemvaultServerError extends Error {
  /** @param {string} message @param {number} [status] the HTTP status, if there was an answer */
  constructor(message, status) {
    super(message);
    this.name = 'MemvaultServerError';
    /** @type {number | undefined} */
    this.status = status;
  }
}

/** What `memvault server` takes as a session or actor header. @param {string} value */
// HTTP drops spaces at a header value's edges, so a label has none.
const labelOk = (value) => /^[\x20-\x7e]{1,128}$/.test(value) && value === value.trim();

// Said whenever a request may have run without its answer arriving.
/** Whether a failed fetch's cause `code` comes before any byte was sent: the connection or its TLS handshake failed. @param {unknown} code */
function notSent(code) {
  if (typeof code !== 'string') return false;
  return ['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', 'UND_ERR_CONNECT_TIMEOUT'].includes(code)
    || /^(CERT_|ERR_TLS_CERT|ERR_SSL_|UNABLE_TO_|DEPTH_ZERO_SELF_SIGNED|SELF_SIGNED_CERT)/.test(code);
}

const UNKNOWN = "the request's outcome is unknown (a change may have been made): view the file before repeating it";

/**
 * `text` with the token, and any piece of 12 or more of its first
 * characters (what a cut left of it), replaced by `[token]`.
 * @param {string} text @param {string} token
 */
/**
 * A reply is ours when it carries our id. A request memvault could not read
 * as one is answered with a null id, always as an error; ours always parse,
 * so a success without our id answers some other request.
 */
function inStep(block, id) {
  if (block === null || typeof block !== 'object' || block.type !== 'tool_result') return false;
  return block.tool_use_id === id || (block.tool_use_id === null && block.is_error === true);
}

function masked(text, token) {
  let out = text.replaceAll(token, '[token]');
  for (let n = token.length - 1; n >= 12; n--) out = out.replaceAll(token.slice(0, n), '[token]');
  return out;
}

const COMMANDS = /** @type {const} */ (['view', 'create', 'str_replace', 'insert', 'delete', 'rename']);

/**
 * Process mode takes `vault`, `keyFile` or `passphraseFile`, `binary` and
 * `env`; HTTP mode takes `url` and `token`. Giving `url` with any process
 * option is a TypeError.
 * @typedef {object} MemvaultMemoryOptions
 * @property {string} [url] HTTP mode: the server's base URL, such as http://127.0.0.1:8700 (default: $MEMVAULT_URL when no process option is given)
 * @property {string} [token] HTTP mode: the bearer token from `memvault tenant add` or `memvault tenant token` (default: $MEMVAULT_TOKEN)
 * @property {string} [vault] the vault directory (else memvault's default: $MEMVAULT_DIR, ...)
 * @property {string} [session] session id stored with every change (default: a new random `s-...`)
 * @property {string} [keyFile] a key file made by `memvault keygen`
 * @property {string} [passphraseFile] a file whose first line is the passphrase
 * @property {string} [actor] who is acting, stored with every change (default `agent`)
 * @property {string} [binary] the memvault executable (default $MEMVAULT_BIN, else `memvault` on the PATH)
 * @property {number} [timeoutMs] how long to wait for one answer, and for the server to exit on close (default 120000; HTTP mode: for the whole request)
 * @property {NodeJS.ProcessEnv} [env] the server's environment (default: this process's)
 */

/**
 * @typedef {{ resolve: (block: any) => void, reject: (err: Error) => void, id: string, timer: NodeJS.Timeout }} Pending
 */

export class MemvaultMemory {
  /** @param {MemvaultMemoryOptions} [options] */
  constructor(options = {}) {
    const processOptions = /** @type {const} */ (['vault', 'keyFile', 'passphraseFile', 'binary', 'env']).filter(
      (name) => options[name] !== undefined,
    );
    let url = options.url;
    if (url !== undefined && processOptions.length) {
      throw new TypeError(
        `give url (HTTP mode, a memvault server) or ${processOptions.join(', ')} (process mode, memvault serve), not both`,
      );
    }
    if (url === undefined && !processOptions.length) url = process.env.MEMVAULT_URL || undefined;
    if (options.token !== undefined && url === undefined) {
      throw new TypeError('token is for HTTP mode: give url too (or set MEMVAULT_URL)');
    }
    if (options.keyFile && options.passphraseFile) {
      throw new TypeError('give keyFile or passphraseFile, not both');
    }
    /** The session id every change is recorded under. */
    this.session = options.session ?? `s-${randomUUID().replaceAll('-', '').slice(0, 16)}`;
    this.timeoutMs = options.timeoutMs ?? 120_000;
    this._closed = false;
    /** HTTP mode: the server's base URL (no token in it); else null. @type {string | null} */
    this.url = null;
    if (url !== undefined) {
      this._initHttp(url, options.token, options.actor ?? 'agent');
      return;
    }
    this.binary = options.binary ?? process.env.MEMVAULT_BIN ?? 'memvault';
    const args = [];
    if (options.vault) args.push('--vault', options.vault);
    if (options.keyFile) args.push('--key-file', options.keyFile);
    if (options.passphraseFile) args.push('--passphrase-file', options.passphraseFile);
    args.push('serve', '--session', this.session, '--actor', options.actor ?? 'agent');

    /** @type {Pending[]} */
    this._pending = [];
    this._next = 1;
    /** @type {string | null} */
    this._dead = null;
    /** @type {string[]} */
    this._stderrTail = [];

    this._proc = spawn(this.binary, args, { stdio: ['pipe', 'pipe', 'pipe'], env: options.env ?? process.env });
    /** @type {(code: number | null) => void} */
    let exited = () => {};
    /** @type {Promise<number | null>} */
    this._exited = new Promise((resolve) => (exited = resolve));
    this._proc.on('close', (code, signal) => {
      this._exitStatus = code !== null ? `exit status ${code}` : `killed by ${signal}`;
      this._fail(`the memvault server exited without answering; ${UNKNOWN}`);
      exited(code);
    });
    this._proc.on('error', (err) => {
      // Only a failed spawn (or kill) reports here; a spawn failure has no 'close'.
      if (this._proc.pid === undefined) {
        this._exitStatus = `could not start: ${err.message}`;
        this._fail('the memvault server could not be started');
        exited(null);
      }
    });
    this._proc.stdin.on('error', () => {}); // a write to a dead server shows up as its exit
    // The server and its pipes do not keep Node running on their own (a
    // MemvaultMemory never closed would): a request waiting for its answer
    // does, through its timer, and so does close() until the server exits.
    this._proc.unref();
    for (const stream of [this._proc.stdin, this._proc.stdout, this._proc.stderr]) {
      /** @type {any} */ (stream).unref?.();
    }
    createInterface({ input: this._proc.stdout }).on('line', (line) => this._answer(line));
    createInterface({ input: this._proc.stderr }).on('line', (line) => {
      if (line.trim()) {
        this._stderrTail.push(line.slice(0, 500));
        if (this._stderrTail.length > 20) this._stderrTail.shift();
      }
    });
  }

  /** The process id of the server (undefined in HTTP mode). */
  get pid() {
    return this._proc?.pid;
  }

  /**
   * Run one memory command (the `input` object of a memory `tool_use`).
   * Resolves to the result content; rejects with `ToolError` for an error
   * result and `MemvaultServerError` when the server is unusable.
   * @param {Record<string, unknown>} input
   * @returns {Promise<string | Array<any>>}
   */
  async execute(input) {
    const block = await (this.url !== null ? this._post(input) : this._request(input));
    if (block.is_error) throw new ToolError(block.content);
    return block.content;
  }

  /** The six handlers `betaMemoryTool` takes, each forwarding to memvault. */
  handlers() {
    /** @type {Record<string, (command: any) => Promise<string | Array<any>>>} */
    // No prototype: a command named like an Object method (`toString`,
    // `constructor`) is no handler, so the SDK reports it unknown.
    const h = Object.create(null);
    for (const name of COMMANDS) h[name] = (command) => this.execute(command);
    return /** @type {import('@anthropic-ai/sdk/helpers/beta/memory').MemoryToolHandlers} */ (
      /** @type {unknown} */ (h)
    );
  }

  /**
   * The runnable memory tool for `toolRunner({ tools: [...] })`.
   * @param {Parameters<typeof betaMemoryTool>[1]} [extraProps] e.g. `{ cache_control: ... }`
   */
  tool(extraProps) {
    // Every command goes to memvault as it came, an unknown or missing
    // one too, so its answer is memvault's (the SDK's own dispatch would
    // answer `X not implemented`).
    return { ...betaMemoryTool(this.handlers(), extraProps), run: (args) => this.execute(args) };
  }

  /**
   * End the server's input and wait for it to exit; resolves to its exit
   * code. Idempotent. Kills the server if it has not exited after `timeoutMs`.
   * HTTP mode: later calls reject; resolves to null.
   * @returns {Promise<number | null>}
   */
  async close() {
    if (this.url !== null) {
      this._closed = true;
      return null;
    }
    if (!this._closed) {
      this._closed = true;
      this._proc.stdin.end();
      const timer = setTimeout(() => this._proc.kill('SIGKILL'), this.timeoutMs);
      try {
        await this._exited;
      } finally {
        clearTimeout(timer);
      }
    }
    return this._exited;
  }

  async [Symbol.asyncDispose]() {
    await this.close();
  }

  /** @param {Record<string, unknown>} input @returns {Promise<any>} */
  _request(input) {
    if (this._closed) return Promise.reject(new MemvaultServerError('this memvault memory tool was closed'));
    if (this._dead) return Promise.reject(new MemvaultServerError(this._dead));
    const id = `toolu_memvault_${this._next++}`;
    let line;
    try {
      // Before anything is queued: input that cannot be sent (a BigInt, a
      // cycle) fails this call alone.
      line = JSON.stringify({ type: 'tool_use', id, name: 'memory', input }) + '\n';
    } catch (e) {
      return Promise.reject(e);
    }
    return new Promise((resolve, reject) => {
      this._pending.push({ resolve, reject, id, timer: null });
      this._proc.stdin.write(line);
      this._arm();
    });
  }

  /**
   * The server answers in order: the clock runs for the oldest request
   * only, from when the answer before it came (or it was sent), so a busy
   * server working through a queue is not taken for a silent one.
   */
  _arm() {
    const head = this._pending[0];
    if (!head || head.timer !== null) return;
    head.timer = setTimeout(() => {
      this._proc.kill('SIGKILL');
      this._exitStatus = `killed: it gave no answer within ${this.timeoutMs} ms`;
      this._fail(`the memvault server gave no answer within ${this.timeoutMs} ms; ${UNKNOWN}`);
    }, this.timeoutMs);
  }

  /** @param {string} line */
  _answer(line) {
    const p = this._pending.shift();
    if (!p) {
      this._fail('the memvault server wrote a line nobody asked for');
      return;
    }
    clearTimeout(p.timer);
    let block;
    try {
      block = JSON.parse(line);
    } catch {
      p.reject(this._deadError('the memvault server wrote a line that is not JSON'));
      this._fail('the memvault server wrote a line that is not JSON');
      return;
    }
    if (!inStep(block, p.id)) {
      p.reject(this._deadError(`the memvault server answered out of step (expected ${p.id})`));
      this._fail(`the memvault server answered out of step (expected ${p.id})`);
      return;
    }
    p.resolve(block);
    this._arm();
  }

  /** @param {string} what */
  _deadError(what) {
    const tail = this._stderrTail.join(' | ');
    return new MemvaultServerError(
      `${what} (${this.binary}, session ${this.session}, ${this._exitStatus ?? 'still running'})` +
        (tail ? `; its last diagnostics: ${tail}` : '') +
        '. Start a new MemvaultMemory to continue.',
    );
  }

  /** Mark the server unusable and reject everything still waiting. @param {string} what */
  _fail(what) {
    if (!this._dead) this._dead = this._deadError(what).message;
    for (const p of this._pending.splice(0)) {
      clearTimeout(p.timer);
      p.reject(new MemvaultServerError(this._dead));
    }
  }

  // -- HTTP mode ----------------------------------------------------------------

  /** @param {string} url @param {string | undefined} token @param {string} actor */
  _initHttp(url, token, actor) {
    let parsed;
    try {
      parsed = new URL(url);
    } catch {
      parsed = null;
    }
    if (!parsed || (parsed.protocol !== 'http:' && parsed.protocol !== 'https:')) {
      throw new TypeError('url must be an http:// or https:// base URL, such as http://127.0.0.1:8700');
    }
    if (parsed.username || parsed.password || parsed.search || parsed.hash) {
      throw new TypeError(
        'url takes no user, password, query or fragment: give the bearer token as token or in MEMVAULT_TOKEN',
      );
    }
    const bearer = (token ?? process.env.MEMVAULT_TOKEN ?? '').trim();
    if (!bearer) throw new TypeError('HTTP mode needs a bearer token: give token or set MEMVAULT_TOKEN');
    if (!/^[\x21-\x7e]+$/.test(bearer)) throw new TypeError('the token is not a bearer token (printable ASCII, no spaces)');
    for (const [name, value] of /** @type {const} */ ([['session', this.session], ['actor', actor]])) {
      if (!labelOk(value)) {
        throw new TypeError(`in HTTP mode the ${name} is 1 to 128 printable ASCII characters, with no space at either end`);
      }
    }
    const base = `${parsed.origin}${parsed.pathname.replace(/\/+$/, '')}`;
    this.url = base;
    this._endpoint = `${base}/v1/memory`;
    this._next = 1;
    // Not enumerable: the token stays out of console.log(memory) and JSON.stringify(memory).
    Object.defineProperty(this, '_token', { value: bearer, enumerable: false });
    Object.defineProperty(this, '_headers', {
      value: {
        authorization: `Bearer ${bearer}`,
        'content-type': 'application/json',
        accept: 'application/json',
        'memvault-session': this.session,
        'memvault-actor': actor,
        'user-agent': 'memvault-memory-js/0.1.0',
      },
      enumerable: false,
    });
  }

  /** One `POST /v1/memory`; the `tool_result` object it answers with. @param {Record<string, unknown>} input @returns {Promise<any>} */
  async _post(input) {
    if (this._closed) throw new MemvaultServerError('this memvault memory tool was closed');
    const id = `toolu_memvault_${this._next++}`;
    const signal = AbortSignal.timeout(this.timeoutMs);
    let status;
    let text;
    try {
      const res = await fetch(/** @type {string} */ (this._endpoint), {
        method: 'POST',
        headers: /** @type {any} */ (this)._headers,
        body: JSON.stringify({ type: 'tool_use', id, name: 'memory', input }),
        signal,
        // A redirect is not followed: the body (memory content) would go
        // to wherever it points, and its answer be taken for memvault's.
        redirect: 'manual',
      });
      status = res.status;
      text = await res.text();
    } catch (e) {
      const err = /** @type {any} */ (e);
      if (signal.aborted) throw this._httpError(`gave no answer within ${this.timeoutMs} ms; ${UNKNOWN}`);
      const cause = err?.cause;
      const why = cause?.message || cause?.code || err?.message || String(err);
      // A connection that could not be made (refused, no such host, a
      // certificate not trusted) sent nothing.
      if (notSent(cause?.code)) throw this._httpError(`could not be reached (${why}); nothing was sent, so nothing was changed`);
      throw this._httpError(`could not be reached (${why}); if the request reached it, ${UNKNOWN}`);
    }
    if (status >= 300 && status < 400) {
      throw this._httpError(
        `answered HTTP ${status}, a redirect, which is not followed (the request would carry memory content elsewhere): give the server's own URL`,
        status,
      );
    }
    if (status !== 200) {
      let message;
      try {
        message = JSON.parse(text).error;
      } catch {
        message = undefined;
      }
      if (typeof message !== 'string') message = text.trim() || 'no message';
      // The token is masked before the text is cut, so no piece of it survives the cut.
      message = masked(message, /** @type {any} */ (this)._token).slice(0, 300);
      // A request memvault could not read (a lone surrogate, which JSON
      // can escape but not carry): Claude's input was malformed, as `serve`
      // answers it in process mode, not the server unusable.
      if (status === 400) throw new ToolError(message);
      // A gateway between (502, 504) may have lost memvault's answer.
      const lost = status === 502 || status === 504 ? `; ${UNKNOWN}` : '';
      throw this._httpError(`answered HTTP ${status}: ${message}${lost}`, status);
    }
    let block;
    try {
      block = JSON.parse(text);
    } catch {
      block = null;
    }
    if (block === null || typeof block !== 'object' || Array.isArray(block)) {
      throw this._httpError('answered HTTP 200 with a body that is not a JSON object', 200);
    }
    if (!inStep(block, id)) {
      throw this._httpError(`answered out of step (expected a tool_result for ${id})`, 200);
    }
    return block;
  }

  /** @param {string} what @param {number} [status] */
  _httpError(what, status) {
    const message = `the memvault server at ${this.url} ${what} (session ${this.session})`;
    // Whatever a server or proxy echoes, the token is not repeated.
    return new MemvaultServerError(masked(message, /** @type {any} */ (this)._token), status);
  }
}
