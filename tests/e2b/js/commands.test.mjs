// Commands and PTYs (process.Process over Connect) with the JS SDK.

import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import { CommandExitError, NotFoundError, Sandbox, TimeoutError } from '#e2b'
import { create, killTracked, waitUntil } from './helpers.mjs'

let sbx
before(async () => {
  sbx = await create()
})
after(killTracked)

const listed = async (pid) => (await sbx.commands.list()).find((p) => p.pid === pid)

describe('commands', () => {
  test('run true and echo', async () => {
    const r = await sbx.commands.run('true')
    assert.deepEqual([r.exitCode, r.stdout, r.stderr], [0, '', ''])
    assert.equal((await sbx.commands.run('echo hello')).stdout, 'hello\n')
  })

  test('commands run in real bash as a login shell', async () => {
    const r = await sbx.commands.run('echo ${BASH_VERSION%%.*}; shopt -q login_shell && echo login')
    assert.equal(r.stdout, '5\nlogin\n')
  })

  test('a nonzero exit throws CommandExitError', async () => {
    await assert.rejects(sbx.commands.run('echo out; echo err >&2; exit 3'), (e) => {
      assert.ok(e instanceof CommandExitError, e)
      assert.deepEqual([e.exitCode, e.stdout, e.stderr], [3, 'out\n', 'err\n'])
      return true
    })
  })

  test('onStdout and onStderr get the chunks in order', async () => {
    const seen = []
    await sbx.commands.run('echo o1; sleep 0.3; echo e1 >&2; sleep 0.3; echo o2', {
      onStdout: (s) => seen.push(['out', s]),
      onStderr: (s) => seen.push(['err', s]),
    })
    assert.deepEqual(seen, [['out', 'o1\n'], ['err', 'e1\n'], ['out', 'o2\n']])
  })

  test('envs, cwd, default user and root', async () => {
    assert.equal((await sbx.commands.run('echo $FOO', { envs: { FOO: 'bar' } })).stdout, 'bar\n')
    assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
    assert.equal((await sbx.commands.run('id -u; pwd')).stdout, '1000\n/home/user\n')
    assert.equal((await sbx.commands.run('id -u', { user: 'root' })).stdout, '0\n')
  })

  test('timeoutMs throws TimeoutError and kills the command', async () => {
    await assert.rejects(sbx.commands.run('sleep 30 # js-timeout', { timeoutMs: 1_000 }), TimeoutError)
    await waitUntil('the timed-out command to be killed', async () =>
      !(await sbx.commands.list()).some((p) => p.args.at(-1) === 'sleep 30 # js-timeout'), 10_000)
  })

  test('background, list, connect, kill true then false', async () => {
    const handle = await sbx.commands.run('sleep 120', { background: true, timeoutMs: 0 })
    const info = await waitUntil('the command in the list', () => listed(handle.pid))
    assert.deepEqual([info.cmd, info.args], ['/bin/bash', ['-l', '-c', 'sleep 120']])
    const connected = await sbx.commands.connect(handle.pid, { timeoutMs: 0 })
    assert.equal(connected.pid, handle.pid)
    assert.equal(await sbx.commands.kill(handle.pid), true)
    await assert.rejects(handle.wait(), (e) => e instanceof CommandExitError && e.exitCode === -1)
    await waitUntil('the killed command to leave the list', async () => !(await listed(handle.pid)))
    assert.equal(await sbx.commands.kill(handle.pid), false)
  })

  test('connect to a running command gets its output', async () => {
    const handle = await sbx.commands.run('sleep 2; echo done', { background: true, timeoutMs: 0 })
    const r = await (await sbx.commands.connect(handle.pid, { timeoutMs: 0 })).wait()
    assert.deepEqual([r.exitCode, r.stdout], [0, 'done\n'])
  })

  test('disconnect leaves the command running', async () => {
    const handle = await sbx.commands.run('sleep 3; echo late', { background: true, timeoutMs: 0 })
    await handle.disconnect()
    assert.ok(await listed(handle.pid))
    const r = await (await sbx.commands.connect(handle.pid, { timeoutMs: 0 })).wait()
    assert.equal(r.stdout, 'late\n')
  })

  test('connect to an unknown pid throws NotFoundError', async () => {
    await assert.rejects(sbx.commands.connect(999999), NotFoundError)
  })

  test('stdin: sendStdin and closeStdin', async () => {
    let seen = ''
    const onStdout = (d) => { seen += d }
    const handle = await sbx.commands.run('cat', { background: true, stdin: true, timeoutMs: 0, onStdout })
    await sbx.commands.sendStdin(handle.pid, 'hello ')
    if (typeof sbx.commands.closeStdin !== 'function') {
      // 2.9 has neither closeStdin nor CommandHandle.sendStdin: what it has is checked.
      await waitUntil('cat to echo its stdin', () => seen === 'hello ')
      await handle.kill()
      return
    }
    await handle.sendStdin(new TextEncoder().encode('world'))
    await sbx.commands.closeStdin(handle.pid)
    const r = await handle.wait()
    assert.deepEqual([r.exitCode, r.stdout], [0, 'hello world'])
  })
})

describe('pty', () => {
  const decoder = new TextDecoder()

  async function openPty(target = sbx) {
    const out = { text: '' }
    const handle = await target.pty.create({
      cols: 80,
      rows: 24,
      timeoutMs: 0,
      onData: (d) => {
        out.text += decoder.decode(d)
      },
    })
    return { handle, out }
  }

  const type = (pid, line, target = sbx) => target.pty.sendInput(pid, new TextEncoder().encode(line))

  test('an interactive shell answers, and resize changes its size', async () => {
    const { handle, out } = await openPty()
    try {
      await type(handle.pid, 'echo $((6*7)) $TERM\n')
      await waitUntil('the PTY output', () => out.text.includes('42 xterm-256color'))
      await sbx.pty.resize(handle.pid, { cols: 120, rows: 40 })
      await type(handle.pid, 'stty size\n')
      await waitUntil('the new size', () => out.text.includes('40 120'))
    } finally {
      await sbx.pty.kill(handle.pid)
    }
  })

  test('kill is true, then false', async () => {
    const { handle } = await openPty()
    assert.equal(await sbx.pty.kill(handle.pid), true)
    await assert.rejects(handle.wait(), CommandExitError)
    assert.equal(await sbx.pty.kill(handle.pid), false)
  })

  test('exit code of the shell', async () => {
    const { handle } = await openPty()
    await type(handle.pid, 'exit 5\n')
    await assert.rejects(handle.wait(), (e) => e instanceof CommandExitError && e.exitCode === 5)
  })

  test('connect from a second Sandbox object', async () => {
    const { handle } = await openPty()
    try {
      const other = await Sandbox.connect(sbx.sandboxId)
      const seen = { text: '' }
      await other.pty.connect(handle.pid, { timeoutMs: 0, onData: (d) => { seen.text += decoder.decode(d) } })
      await type(handle.pid, 'echo $((7*6))-again\n', other)
      await waitUntil('output on the second connection', () => seen.text.includes('42-again'))
    } finally {
      await sbx.pty.kill(handle.pid)
    }
  })
})
