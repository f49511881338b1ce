# frozen_string_literal: true

require "test_helper"

# Fairness under many ready descriptors: when data reaches hundreds of connections at once, every
# reader wakes within a few turns of the loop, not one small batch a turn. (io_uring's kernel hands
# its completions over 20 at a time unless asked again: 8,192 keep-alive connections had some
# requests wait over a second.)
class FairnessTest < Minitest::Test
  include EvtTest

  # Bounds of the C core's policy: the pure-Ruby loop does not promise them (README, "The pure-Ruby loop").
  def setup
    skip "the pure-Ruby loop promises no fairness bound" if SELECT
  end

  PAIRS = 400 # the select backend's descriptors must stay under FD_SETSIZE
  TURNS = 8   # enough for a readiness backend to grow its array of fired events to PAIRS

  def test_every_reader_wakes_within_a_few_turns_of_its_data
    pairs = Array.new(PAIRS) { UNIXSocket.pair }
    turns = 0
    sent_at = nil
    woke_at = []
    evt do
      waiting = pairs.map do |reader, _|
        Fiber.schedule do
          assert_equal "x", reader.read(1)
          woke_at << turns
        end
      end
      refute_empty waiting
      Fiber.schedule do
        # Each reader waits by now (a scheduled fiber runs until it waits); a turn of the loop
        # hands their reads to the kernel (io_uring submits with its next look).
        2.times { sleep 0 }
        # write_nonblock does not call the scheduler: the data reaches all the readers before
        # this fiber lets the loop turn again.
        pairs.each { |_, writer| writer.write_nonblock("x") }
        sent_at = turns
        # Counts the loop's turns: a fiber that yields is resumed once a turn.
        until woke_at.size == PAIRS
          sleep 0
          turns += 1
        end
      end
    end
    assert_equal PAIRS, woke_at.size
    latest = woke_at.max - sent_at
    assert_operator latest, :<=, TURNS, "the last reader woke #{latest} turns after its data (first: #{woke_at.min - sent_at})"
  ensure
    pairs&.each { |a, b| [a, b].each(&:close) }
  end

  CONNECTIONS = 100
  BUSY = 200

  # An accept loop that starts a fiber per connection goes on as soon as that fiber waits, so it
  # takes every pending connection in a turn or two. (It used to wait behind every ready fiber
  # after each start: one connection a turn, and at 8,192 connections 2,000 of them sat in the
  # listen queue for the whole run.)
  def test_an_accept_loop_takes_every_pending_connection_within_a_few_turns
    server = TCPServer.new("127.0.0.1", 0)
    clients = Array.new(CONNECTIONS) { TCPSocket.new("127.0.0.1", server.local_address.ip_port) }
    accepted_at = []
    done = false
    evt do
      # Fibers always ready, as request fibers under load are: a turn resumes each of them.
      BUSY.times { Fiber.schedule { sleep 0 until done } }
      count_turns { done }
      Fiber.schedule do
        CONNECTIONS.times do
          connection = server.accept
          accepted_at << @turns
          Fiber.schedule { connection.read(1) } # waits: the client writes nothing yet
        end
        clients.each { |client| client.write_nonblock("x") }
        done = true
      end
    end
    assert_equal CONNECTIONS, accepted_at.size
    spread = accepted_at.max - accepted_at.min
    assert_operator spread, :<=, 2, "#{CONNECTIONS} pending connections took #{spread} turns to accept"
  ensure
    clients&.each(&:close)
    server&.close
  end

  # A fiber that starts fibers without pause goes first only so many times a turn (as many as the
  # turn had ready, at least 64): the others still run every turn.
  def test_a_fiber_starting_fibers_without_pause_does_not_starve_the_others
    done = false
    started_at = Hash.new(0)
    evt do
      count_turns { done }
      Fiber.schedule do
        1000.times do
          started_at[@turns] += 1
          Fiber.schedule { sleep 0.2 }
        end
        done = true
      end
    end
    assert_operator started_at.size, :>=, 10, "the other fiber ran only #{started_at.size} turns while 1,000 fibers started"
    assert_operator started_at.values.max, :<=, 70, "#{started_at.values.max} fibers started in one turn"
  end

  READS = 200

  # A fiber whose reads always find data (a peer that answers before the server reads again) lets
  # the others run after a few of them: it used to read on without ever leaving, and under keep-alive
  # load a few such connections held every turn for a hundred milliseconds while the rest waited.
  # Its data all arrives, in order.
  def test_a_reader_that_always_finds_data_lets_the_others_run
    reader, writer = UNIXSocket.pair
    writer.write((0...READS).map { |i| (i % 256).chr }.join) # sysread(1) below: unbuffered, the hook each time
    data = +""
    reads_done = []
    evt do
      count_turns { data.bytesize == READS }
      Fiber.schedule do
        READS.times do
          data << reader.sysread(1)
          reads_done << @turns
        end
      end
    end
    assert_equal (0...READS).map { |i| (i % 256).chr }.join.b, data.b
    per_turn = reads_done.tally.values.max
    assert_operator per_turn, :<=, 16, "#{per_turn} of #{READS} reads found data in one turn without letting the others run"
  ensure
    [reader, writer].each { |io| io&.close }
  end

  private

  # A fiber that counts the loop's turns in @turns until the block says to stop: a fiber that
  # yields is resumed once a turn.
  def count_turns
    @turns = 0
    Fiber.schedule do
      until yield
        sleep 0
        @turns += 1
      end
    end
  end
end
