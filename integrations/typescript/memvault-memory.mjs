// memvault as the backend of @anthropic-ai/sdk's memory tool.
//
// `MemvaultMemory` starts one `memvault serve` process and forwards every
// memory command to it as one JSON line, reading back the `tool_result` line
// memvault writes. `memory.tool()` is `betaMemoryTool(handlers)` from the
// SDK: pass it in `tools` to `client.beta.messages.toolRunner(...)`. A
// success resolves to the result text (or image blocks); an error result is
// thrown as the SDK's `ToolError`, so the runner sends it to Claude with
// `is_error: true`, word for word.
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
// Promises: one server for the object's lifetime (the vault is unlocked
// once); requests are written in call order and answers matched by id, so
// concurrent calls are safe; `close()` ends input and waits for the server
// to exit (it kills it only after `timeoutMs`); a server that died, hung or
// answered out of step rejects with a `MemvaultServerError` naming the exit
// status and the server's last diagnostic lines (memvault never writes
// memory content or secrets to stderr), and so does every later call.
// Plain ES module with JSDoc types: runs on Node.js 20+ without a build step.

import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { createInterface } from 'node:readline';
import { betaMemoryTool } from '@anthropic-ai/sdk/helpers/beta/memory';
import { ToolError } from '@anthropic-ai/sdk/lib/tools/ToolError';

/** The `memvault serve` process is gone, hung or out of step. */
export class MemvaultServerError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'MemvaultServerError';
  }
}

const COMMANDS = /** @type {const} */ (['view', 'create', 'str_replace', 'insert', 'delete', 'rename']);

/**
 * @typedef {object} MemvaultMemoryOptions
 * @property {string} [vault] the vault directory (else memvault's default: $MEMVAULT_DIR, ...)
 * @property {string} [session] session id stored with every change (default: a new random `s-...`)
 * @property {string} [keyFile] a key file made by `memvault keygen`
 * @property {string} [passphraseFile] a file whose first line is the passphrase
 * @property {string} [actor] who is acting, stored with every change (default `agent`)
 * @property {string} [binary] the memvault executable (default $MEMVAULT_BIN, else `memvault` on the PATH)
 * @property {number} [timeoutMs] how long to wait for one answer, and for the server to exit on close (default 120000)
 * @property {NodeJS.ProcessEnv} [env] the server's environment (default: this process's)
 */

/**
 * @typedef {{ resolve: (block: any) => void, reject: (err: Error) => void, id: string, timer: NodeJS.Timeout }} Pending
 */

export class MemvaultMemory {
  /** @param {MemvaultMemoryOptions} [options] */
  constructor(options = {}) {
    if (options.keyFile && options.passphraseFile) {
      throw new TypeError('give keyFile or passphraseFile, not both');
    }
    /** The session id every change is recorded under. */
    this.session = options.session ?? `s-${randomUUID().replaceAll('-', '').slice(0, 16)}`;
    this.timeoutMs = options.timeoutMs ?? 120_000;
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
    this._closed = false;
    /** @type {string[]} */
    this._stderrTail = [];

    this._proc = spawn(this.binary, args, { stdio: ['pipe', 'pipe', 'pipe'], env: options.env ?? process.env });
    /** @type {(code: number | null) => void} */
    let exited = () => {};
    /** @type {Promise<number | null>} */
    this._exited = new Promise((resolve) => (exited = resolve));
    this._proc.on('close', (code, signal) => {
      this._exitStatus = code !== null ? `exit status ${code}` : `killed by ${signal}`;
      this._fail('the memvault server exited without answering');
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
    createInterface({ input: this._proc.stdout }).on('line', (line) => this._answer(line));
    createInterface({ input: this._proc.stderr }).on('line', (line) => {
      if (line.trim()) {
        this._stderrTail.push(line.slice(0, 500));
        if (this._stderrTail.length > 20) this._stderrTail.shift();
      }
    });
  }

  /** The process id of the server. */
  get pid() {
    return this._proc.pid;
  }

  /**
   * Run one memory command (the `input` object of a memory `tool_use`).
   * Resolves to the result content; rejects with `ToolError` for an error
   * result and `MemvaultServerError` when the server is unusable.
   * @param {Record<string, unknown>} input
   * @returns {Promise<string | Array<any>>}
   */
  async execute(input) {
    const block = await this._request(input);
    if (block.is_error) throw new ToolError(block.content);
    return block.content;
  }

  /** The six handlers `betaMemoryTool` takes, each forwarding to memvault. */
  handlers() {
    /** @type {Record<string, (command: any) => Promise<string | Array<any>>>} */
    const h = {};
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
    return betaMemoryTool(this.handlers(), extraProps);
  }

  /**
   * End the server's input and wait for it to exit; resolves to its exit
   * code. Idempotent. Kills the server if it has not exited after `timeoutMs`.
   * @returns {Promise<number | null>}
   */
  async close() {
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
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this._proc.kill('SIGKILL');
        this._fail(`the memvault server gave no answer within ${this.timeoutMs} ms`);
      }, this.timeoutMs);
      this._pending.push({ resolve, reject, id, timer });
      this._proc.stdin.write(JSON.stringify({ type: 'tool_use', id, name: 'memory', input }) + '\n');
    });
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
    // A request memvault could not read as one gets a null id; ours always parse.
    if (block?.type !== 'tool_result' || (block.tool_use_id !== p.id && block.tool_use_id !== null)) {
      p.reject(this._deadError(`the memvault server answered out of step (expected ${p.id})`));
      this._fail(`the memvault server answered out of step (expected ${p.id})`);
      return;
    }
    p.resolve(block);
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
}
