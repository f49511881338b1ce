# frozen_string_literal: true

require "socket"

module Evt
  # Resolves host names for {Scheduler#address_resolve} on a few threads of its own: getaddrinfo(3)
  # blocks one of them, not the loop. A fiber asking waits on a queue; the thread that answers
  # unblocks it through the loop. Threads start on first use, after a fork too, and end with {#close}.
  # @api private
  class Resolver
    # @param size [Integer] how many names may be resolved at once
    # @raise [ArgumentError] size is not a positive Integer
    def initialize(size: 4)
      raise ArgumentError, "evt: resolver size must be positive" unless size.is_a?(Integer) && size.positive?

      @size = size
      @threads = []
      @requests = nil
      @pid = nil
    end

    # Resolves `hostname` on one of the threads while the calling fiber waits; a numeric address
    # at once, on the calling thread.
    # @param hostname [String]
    # @return [Array<String>] the addresses of `hostname` (a "%zone" suffix is dropped: Ruby parses
    #   the addresses again, as numbers, and a scope cannot come through).
    # @raise [Socket::ResolutionError] as getaddrinfo would for an unknown name
    def resolve(hostname)
      name = hostname.to_s.split("%", 2).first
      literal = numeric(name)
      return literal if literal

      start if @pid != Process.pid
      answer = Thread::Queue.new
      @requests << [name, answer]
      addresses, error = answer.pop
      raise error if error

      addresses
    end

    # Ends the threads (each finishes the name it resolves); the next {#resolve} starts new ones.
    # @return [void]
    def close
      @requests&.close
      @requests = nil
      @pid = nil
      @threads.clear
    end

    private

    # An address given as a number needs no thread: AI_NUMERICHOST never asks the network (nor the
    # scheduler).
    def numeric(name)
      Addrinfo.getaddrinfo(name, nil, nil, :STREAM, nil, Socket::AI_NUMERICHOST).map(&:ip_address).uniq
    rescue SocketError
      nil
    end

    def start
      # Threads do not survive a fork: a child starts its own.
      @requests = Thread::Queue.new
      @pid = Process.pid
      requests = @requests
      @threads = Array.new(@size) do
        Thread.new do
          Thread.current.name = "evt resolver"
          Thread.current.report_on_exception = false
          while (request = requests.pop)
            name, answer = request
            begin
              answer << [Addrinfo.getaddrinfo(name, nil, nil, :STREAM).map(&:ip_address).uniq, nil]
            rescue StandardError => e
              answer << [nil, e]
            end
          end
        end
      end
    end
  end
end
